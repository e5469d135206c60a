// Command conformance is the Go client's adapter for the client
// conformance kit (clients/conformance/kit.py, docs/CLIENTS.md,
// "Conformance kit"), with DLOCK_SERVER naming the nodes.
//
// Run as `conformance KEY`, it takes KEY exclusively without a lease,
// waiting as long as it takes, prints "held FENCE", keeps the lock until a
// line arrives on stdin (or stdin ends), releases it, prints "released"
// and exits 0. A lock found lost meanwhile prints "lost REASON" and exits
// 1; any other error exits 2.
//
// Run as `conformance --turns N KEY`, two goroutines share one Client;
// each, N times, locks KEY exclusively without a lease (waiting as long as
// it takes), prints "enter W FENCE" (W is 1 or 2), holds it for 20 ms,
// prints "leave W FENCE" and unlocks. It exits 0 when both are done; on
// any error it prints "error TEXT" and exits 1.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	dlock "dlock/clients/go"
)

func main() {
	switch {
	case len(os.Args) == 2:
		hold(os.Args[1])
	case len(os.Args) == 4 && os.Args[1] == "--turns":
		n, err := strconv.Atoi(os.Args[2])
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "conformance: --turns %q is not a count\n", os.Args[2])
			os.Exit(2)
		}
		turns(n, os.Args[3])
	default:
		fmt.Fprintln(os.Stderr, "usage: conformance KEY | conformance --turns N KEY (DLOCK_SERVER names the nodes)")
		os.Exit(2)
	}
}

func hold(key string) {
	ctx := context.Background()
	client, err := dlock.Connect(ctx, "", nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	defer client.Close()
	lock, err := client.Lock(ctx, []string{key}, nil)
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

// turns has two goroutines of one Client take key n times each: they must
// take turns, as two processes would.
func turns(n int, key string) {
	ctx := context.Background()
	var mu sync.Mutex
	say := func(format string, args ...interface{}) {
		// One write per line, never two at once: the kit reads whole lines.
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	fail := func(err error) {
		mu.Lock()
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	client, err := dlock.Connect(ctx, "", nil)
	if err != nil {
		fail(err)
	}
	defer client.Close()
	var wg sync.WaitGroup
	for w := 1; w <= 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < n; i++ {
				lock, err := client.Lock(ctx, []string{key}, nil)
				if err != nil {
					fail(err)
				}
				say("enter %d %d", w, lock.Fence())
				time.Sleep(20 * time.Millisecond)
				// Lost while held is no turn taken.
				if err := lock.Check(); err != nil {
					fail(err)
				}
				say("leave %d %d", w, lock.Fence())
				if err := lock.Unlock(ctx); err != nil {
					fail(err)
				}
			}
		}(w)
	}
	wg.Wait()
}
