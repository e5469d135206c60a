package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	dlock "dlock/clients/go"
)

// Take a lock, use its fencing token, stop if it is lost, unlock.
func Example() {
	ctx := context.Background()
	// "" connects to DLOCK_SERVER (a comma-separated list for a cluster),
	// else 127.0.0.1:7436; DLOCK_TOKEN and DLOCK_TLS_CA/CERT/KEY are read too.
	client, err := dlock.Connect(ctx, "", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	lock, err := client.Lock(ctx, []string{"reports/daily"}, &dlock.LockOptions{Wait: 30 * time.Second})
	if errors.Is(err, dlock.ErrTimeout) {
		log.Fatal("someone else is making the report")
	} else if err != nil {
		log.Fatal(err)
	}
	work := make(chan struct{})
	go func() {
		defer close(work)
		// ... write the report, passing lock.Fence() to the storage ...
	}()
	select {
	case <-work:
	case <-lock.Lost():
		log.Fatal(lock.Err()) // stop: the server may hand the lock on
	}
	if err := lock.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("report written under fence", lock.Fence() > 0)
	// Output: report written under fence true
}

// Another client finds the key busy: ErrBusy with Try, ErrTimeout when a
// wait runs out; the error lists the busy keys.
func ExampleClient_Lock_busy() {
	ctx := context.Background()
	a, _ := dlock.Connect(ctx, "", nil)
	defer a.Close()
	b, _ := dlock.Connect(ctx, "", nil)
	defer b.Close()

	held, err := a.Lock(ctx, []string{"jobs/nightly"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.Lock(ctx, []string{"jobs/nightly"}, &dlock.LockOptions{Try: true})
	var refusal *dlock.ServerError
	fmt.Println(errors.Is(err, dlock.ErrBusy), errors.As(err, &refusal) && refusal.Keys[0] == "jobs/nightly")
	_ = held.Unlock(ctx)
	// Output: true true
}

// A lease outlives the connection and ends unless renewed: KeepAlive
// renews it every third of its length.
func ExampleLock_KeepAlive() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, _ := dlock.Connect(ctx, "", nil)
	defer client.Close()

	lock, err := client.Lock(ctx, []string{"jobs/export"}, &dlock.LockOptions{Lease: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := lock.KeepAlive(ctx); errors.Is(err, dlock.ErrLockLost) {
			log.Print("stop: ", err)
		}
	}()
	// ... the work ...
	fmt.Println(lock.Lease())
	_ = lock.Unlock(ctx)
	// Output: 30s
}

// Leader election: campaigners queue for the key; the holder leads and
// its value says who it is.
func ExampleElection() {
	ctx := context.Background()
	client, _ := dlock.Connect(ctx, "", nil)
	defer client.Close()

	election := client.Election("service/leader")
	leadership, err := election.Campaign(ctx, []byte("node-a:8080"))
	if err != nil {
		log.Fatal(err)
	}
	leader, _ := election.Leader(ctx)
	fmt.Printf("%s leads\n", leader.Value)

	observer, _ := dlock.Connect(ctx, "", nil)
	defer observer.Close()
	octx, stop := context.WithCancel(ctx)
	changes := observer.Election("service/leader").Observe(octx)
	fmt.Printf("observed %s\n", (<-changes).Value)
	_ = leadership.Unlock(ctx)
	fmt.Println("then nobody:", <-changes == nil)
	stop()
	// Output:
	// node-a:8080 leads
	// observed node-a:8080
	// then nobody: true
}
