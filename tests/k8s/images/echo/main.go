// echo: a tiny static HTTP server used as a test workload by the real-node
// harness (tests/k8s/test_realnode.py), packed on an empty image.
//
//	/echo                      serve on :$PORT (default 8080)
//	/echo say WORDS...         print WORDS and exit (for `kubectl exec`)
//
// GET / answers "hello from <POD_NAME>\n"; every request is logged to stdout
// so `kubectl logs` has something to show.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "say" {
		fmt.Println(strings.Join(os.Args[2:], " "))
		return
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
