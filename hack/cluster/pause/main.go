// Command ftjob-pause is the pod sandbox ("pause") process of the local real node, and also the
// process that holds the node's network and mount namespaces open (hack/cluster/node-up.sh).
//
// It does what every pause container does and nothing else: sleep until SIGINT or SIGTERM, then
// exit 0, and reap children whose parent died inside the pod's PID namespace (SIGCHLD → wait4).
// Static and standard library only, so the image is one file on top of scratch and needs no
// registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
