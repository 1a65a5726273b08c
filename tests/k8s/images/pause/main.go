// pause: the sandbox ("infra") container of every pod on the real-node
// harness (tests/k8s/realnode.py).  It holds the pod's namespaces open, reaps
// orphaned children and exits on SIGINT/SIGTERM, like registry.k8s.io/pause.
// Built static (CGO_ENABLED=0) by scripts/k8s-tools.sh and packed on an empty
// ("FROM scratch") image by tests/k8s/ociimage.py: no registry needed.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (sluice test harness)")
		return
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for { // reap every exited child (we are PID 1 of a shared PID namespace)
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
