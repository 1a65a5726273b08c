// echo: a tiny static HTTP server (and client) used as a test workload by the
// real-node harness (tests/k8s/test_realnode.py), packed on an empty image.
//
//	/echo                 serve on :$PORT (default 8080)
//	/echo say WORDS...    print WORDS and exit (for `kubectl exec`)
//	/echo get URL         GET URL, print the body; exit 1 on a non-2xx status.
//	                      https URLs are verified with the pod's ServiceAccount
//	                      CA and carry its token, as an in-cluster client does
//	/echo id              print "uid=N gid=N rootfs=writable|read-only"
//
// GET / answers "hello from <POD_NAME>\n"; every request is logged to stdout
// so `kubectl logs` has something to show.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount/"

func get(url string) int {
	client := &http.Client{Timeout: 10 * time.Second}
	req, _ := http.NewRequest("GET", url, nil)
	if strings.HasPrefix(url, "https://") {
		pool := x509.NewCertPool()
		if ca, err := os.ReadFile(saDir + "ca.crt"); err == nil {
			pool.AppendCertsFromPEM(ca)
		}
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "kubernetes.default.svc"}}
		if token, err := os.ReadFile(saDir + "token"); err == nil {
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	os.Stdout.Write(body)
	if resp.StatusCode/100 != 2 {
		fmt.Fprintf(os.Stderr, "status %d\n", resp.StatusCode)
		return 1
	}
	return 0
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "say":
			fmt.Println(strings.Join(os.Args[2:], " "))
			return
		case "get":
			os.Exit(get(os.Args[2]))
		case "id":
			rootfs := "writable"
			if f, err := os.Create("/.probe"); err != nil {
				rootfs = "read-only"
			} else {
				f.Close()
				os.Remove("/.probe")
			}
			fmt.Printf("uid=%d gid=%d rootfs=%s\n", os.Getuid(), os.Getgid(), rootfs)
			return
		}
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	name := os.Getenv("POD_NAME")
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		log.Printf("GET %s from %s", r.URL.Path, r.RemoteAddr)
		fmt.Fprintf(w, "hello from %s\n", name)
	})
	log.SetOutput(os.Stdout)
	log.Printf("echo %s listening on :%s", name, port)
	log.Fatal(http.ListenAndServe(":"+port, nil))
}
