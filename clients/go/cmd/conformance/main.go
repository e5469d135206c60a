// Command conformance is the Go client's adapter for the client
// conformance kit (clients/conformance/kit.py, docs/CLIENTS.md,
// "Conformance kit"): run as `conformance KEY` with DLOCK_SERVER set, it
// takes KEY exclusively without a lease, waiting as long as it takes,
// prints "held FENCE", keeps the lock until a line arrives on stdin (or
// stdin ends), releases it, prints "released" and exits 0. A lock found
// lost meanwhile prints "lost REASON" and exits 1; any other error exits 2.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"

	dlock "dlock/clients/go"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: conformance KEY (DLOCK_SERVER names the nodes)")
		os.Exit(2)
	}
	ctx := context.Background()
	client, err := dlock.Connect(ctx, "", nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	defer client.Close()
	lock, err := client.Lock(ctx, []string{os.Args[1]}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	fmt.Printf("held %d\n", lock.Fence())
	line := make(chan struct{})
	go func() {
		// A line or the end of stdin: either is the word to release.
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		close(line)
	}()
	select {
	case <-lock.Lost():
		fmt.Printf("lost %v\n", lock.Err())
		os.Exit(1)
	case <-line:
	}
	// Past the safety deadline, the lock is not to be counted as held to
	// the end, even if the unlock finds it.
	if err := lock.Check(); err != nil {
		fmt.Printf("lost %v\n", err)
		os.Exit(1)
	}
	if err := lock.Unlock(ctx); err != nil {
		fmt.Printf("lost %v\n", err)
		os.Exit(1)
	}
	fmt.Println("released")
}
