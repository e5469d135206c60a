package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "dlock/clients/go/dlockpb"
)

func TestConnectSaysHelloAndLearnsTheSessionTimeout(t *testing.T) {
	s := startServer(t, "", "--idle-timeout", "7s")
	c := connect(t, s.Addr, nil)
	lim := c.Limits()
	if lim.SessionTimeout != 7*time.Second || lim.MaxFrame != 16384 || lim.ResumableSessions || c.Session() != 0 {
		t.Fatalf("limits %+v session %d", lim, c.Session())
	}
}

func TestTwoClientsExcludeEachOther(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	var inside, overlaps, rounds int32
	var wg sync.WaitGroup
	var lastFence uint64
	var fenceMu sync.Mutex
	for g := 0; g < 2; g++ {
		c := connect(t, s.Addr, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				l, err := c.Lock(ctx, []string{"shared"}, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if atomic.AddInt32(&inside, 1) != 1 {
					atomic.AddInt32(&overlaps, 1)
				}
				fenceMu.Lock()
				if l.Fence() <= lastFence {
					t.Errorf("fence %d not above the previous %d", l.Fence(), lastFence)
				}
				lastFence = l.Fence()
				fenceMu.Unlock()
				atomic.AddInt32(&inside, -1)
				atomic.AddInt32(&rounds, 1)
				if err := l.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if overlaps != 0 || rounds != 100 {
		t.Fatalf("%d overlaps in %d rounds", overlaps, rounds)
	}
}

func TestManyGoroutinesPipelineOnOneConnectionAndAnswersComeInOrder(t *testing.T) {
	s := startServer(t, "")
	c := connect(t, s.Addr, &Options{MaxInFlight: 64})
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			key := fmt.Sprintf("pipe/%d", g)
			for i := 0; i < 50; i++ {
				l, err := c.Lock(ctx, []string{key}, &LockOptions{Try: true})
				if err != nil {
					t.Error(err)
					return
				}
				info, err := c.Inspect(ctx, []string{key})
				if err != nil || len(info) != 1 || info[0].Key != key || info[0].First().Fence != l.Fence() || !info[0].First().HeldByCaller {
					t.Errorf("inspect %s: %+v %v", key, info, err)
					return
				}
				if err := l.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	// A Lock that waits does so on a connection of its own: it holds back
	// nothing sent after it on the shared one.
	holder := connect(t, s.Addr, nil)
	held, err := holder.Lock(ctx, []string{"order"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan error, 1)
	go func() {
		l, err := c.Lock(ctx, []string{"order"}, nil)
		if err == nil {
			err = l.Unlock(ctx)
		}
		granted <- err
	}()
	waitFor(t, "the Lock waits", func() bool {
		info, err := holder.Inspect(ctx, []string{"order"})
		return err == nil && info[0].Waiters == 1
	})
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	if _, err := c.Ping(pctx); err != nil {
		t.Fatalf("a Ping sent while a Lock waits: %v", err)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatal(err)
	}
}

func TestBusyAndTimeoutAreTypedAndNameTheKeys(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	a, b := connect(t, s.Addr, nil), connect(t, s.Addr, nil)
	if _, err := a.Lock(ctx, []string{"k"}, nil); err != nil {
		t.Fatal(err)
	}
	_, err := b.Lock(ctx, []string{"k", "free"}, &LockOptions{Try: true})
	var se *ServerError
	if !errors.Is(err, ErrBusy) || errors.Is(err, ErrTimeout) || !errors.As(err, &se) || len(se.Keys) != 1 || se.Keys[0] != "k" {
		t.Fatalf("try-lock of a busy key: %v", err)
	}
	_, err = b.Lock(ctx, []string{"k"}, &LockOptions{Wait: 10 * time.Millisecond})
	if !errors.Is(err, ErrTimeout) || errors.Is(err, ErrBusy) || se.Status != pb.ResponseStatus_AcquireTimeout {
		t.Fatalf("a wait that runs out: %v", err)
	}
}

func TestACancelledWaitReturnsAtOnceAndAGrantArrivingLaterIsReleased(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	holder, waiter, third := connect(t, s.Addr, nil), connect(t, s.Addr, nil), connect(t, s.Addr, nil)
	held, err := holder.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Lock(wctx, []string{"k"}, nil)
		done <- err
	}()
	waitFor(t, "the Lock waits", func() bool {
		info, err := holder.Inspect(ctx, []string{"k"})
		return err == nil && info[0].Waiters == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled Lock: %v", err)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The waiter's grant arrives, and the client releases it: a third
	// client gets the key.
	l, err := third.Lock(ctx, []string{"k"}, &LockOptions{Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("the grant nobody collected was not released: %v", err)
	}
	_ = l.Unlock(ctx)
	// A deadline is sent as the wait limit: the server itself withdraws.
	held, _ = holder.Lock(ctx, []string{"d"}, nil)
	dctx, dcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer dcancel()
	if _, err := waiter.Lock(dctx, []string{"d"}, nil); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrTimeout) {
		t.Fatalf("a Lock past its context's deadline: %v", err)
	}
	waitFor(t, "the server withdraws the request at the deadline", func() bool {
		info, err := holder.Inspect(ctx, []string{"d"})
		return err == nil && info[0].Waiters == 0
	})
	_ = held.Unlock(ctx)
}

func TestALockOnAFrozenPathIsLostBeforeTheServerCanGiveItAway(t *testing.T) {
	// Session timeout 2 s: margin a quarter of it, 0.5 s.
	s := startServer(t, "", "--idle-timeout", "2s")
	ctx := testCtx(t)
	fw := startForwarder(t, s.Addr)
	holder := connect(t, fw.Addr, nil)
	l, err := holder.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := l.Deadline()
	fw.freeze()
	other := connect(t, s.Addr, nil)
	taken, err := other.Lock(ctx, []string{"k"}, &LockOptions{Wait: limit})
	grantedAt := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	default:
		t.Fatalf("k was granted to another client while the holder's lock was not lost")
	}
	var lost *LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != LostDeadline || !errors.Is(l.Err(), ErrLockLost) {
		t.Fatalf("lost for %v", l.Err())
	}
	if !l.Deadline().Before(grantedAt) || l.Deadline().After(deadline.Add(time.Second)) {
		t.Fatalf("deadline %v, granted to another at %v", l.Deadline(), grantedAt)
	}
	_ = taken.Unlock(ctx)
}

func TestALockOnAPausedServerIsLostAtItsDeadline(t *testing.T) {
	s := startServer(t, "", "--idle-timeout", "2s")
	ctx := testCtx(t)
	holder := connect(t, s.Addr, nil)
	l, err := holder.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.signal(syscall.SIGSTOP)
	defer s.signal(syscall.SIGCONT)
	select {
	case <-l.Lost():
	case <-time.After(limit):
		t.Fatal("the lock was not reported lost")
	}
	if time.Now().After(l.Deadline()) {
		t.Fatalf("reported lost only after its deadline")
	}
	if r := l.Err().(*LostError).Reason; r != LostDeadline {
		t.Fatalf("lost for %v", l.Err())
	}
	s.signal(syscall.SIGCONT)
}

func TestPingsKeepAQuietLockHeldAndAnAnswerMovesTheDeadline(t *testing.T) {
	s := startServer(t, "", "--idle-timeout", "1s")
	ctx := testCtx(t)
	c := connect(t, s.Addr, nil)
	l, err := c.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := l.Deadline()
	// Three session timeouts: the pinger's answers keep moving it.
	select {
	case <-l.Lost():
		t.Fatalf("lost: %v", l.Err())
	case <-time.After(3 * time.Second):
	}
	if !l.Deadline().After(first) || l.Check() != nil {
		t.Fatalf("deadline did not move: %v -> %v (%v)", first, l.Deadline(), l.Check())
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestALeaseIsLostUnlessKeptAliveAndRenewMovesIt(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	c := connect(t, s.Addr, nil)
	short, err := c.Lock(ctx, []string{"short"}, &LockOptions{Lease: 800 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := c.Lock(ctx, []string{"kept"}, &LockOptions{Lease: 800 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	kctx, stop := context.WithCancel(ctx)
	go func() { _ = kept.KeepAlive(kctx) }()
	<-short.Lost()
	if r := short.Err().(*LostError).Reason; r != LostDeadline {
		t.Fatalf("lost for %v", short.Err())
	}
	time.Sleep(1600 * time.Millisecond) // two leases: only renewals keep it
	if err := kept.Check(); err != nil {
		t.Fatalf("kept alive, yet %v", err)
	}
	stop()
	if err := kept.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The short lease ran out on the server too.
	err = short.Unlock(ctx)
	if !errors.Is(err, ErrNotHeld) {
		t.Fatalf("unlock of a lease that ran out: %v", err)
	}
	// Renew turns a lock without a lease into a lease that outlives the
	// connection.
	bound, err := c.Lock(ctx, []string{"b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bound.Renew(ctx, 20*time.Second); err != nil || bound.Lease() != 20*time.Second {
		t.Fatalf("renew: %v (lease %v)", err, bound.Lease())
	}
	if time.Until(bound.Deadline()) < 19*time.Second {
		t.Fatalf("deadline %v", time.Until(bound.Deadline()))
	}
	_ = c.Close()
	<-bound.Lost()
	other := connect(t, s.Addr, nil)
	if _, err := other.Lock(ctx, []string{"b"}, &LockOptions{Try: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("the lease did not outlive its connection: %v", err)
	}
	if err := other.Unlock(ctx, []string{"b"}, bound.Fence()); err != nil {
		t.Fatal(err)
	}
}

func TestKeepAliveFollowsARenewOfALockWithoutALease(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	c := connect(t, s.Addr, nil)
	l, err := c.Lock(ctx, []string{"promoted"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = l.KeepAlive(kctx) }()
	// Both the watchdog and KeepAlive wait for the change; both must see
	// it, or the new lease is never renewed.
	if err := l.Renew(ctx, 800*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1600 * time.Millisecond) // two leases: only renewals keep it
	if err := l.Check(); err != nil {
		t.Fatalf("kept alive, yet %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAShorterLeaseCountsFromItsSendingEvenWhenItsAnswerNeverComes(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	fw := startForwarder(t, s.Addr)
	c := connect(t, fw.Addr, nil)
	l, err := c.Lock(ctx, []string{"short"}, &LockOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	fw.freeze()
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := l.Renew(rctx, 3*time.Second); err == nil {
		t.Fatal("answered through a frozen path")
	}
	// The server may apply it: the 60 s lease must not be trusted on.
	if d := l.Deadline(); d.After(sent.Add(3 * time.Second)) {
		t.Fatalf("deadline %v from now", time.Until(d))
	}
}

func TestTheConnectionEndingLosesLocksWithoutALeaseAndFailsLaterCalls(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	c := connect(t, s.Addr, nil)
	l, err := c.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.kill()
	<-l.Lost()
	if !errors.Is(l.Err(), ErrLockLost) || l.Err().(*LostError).Reason != LostConnection {
		t.Fatalf("lost for %v", l.Err())
	}
	<-c.Done()
	if _, err := c.Ping(ctx); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("a call after the end: %v", err)
	}
}

func TestConnectErrorsNameTheAddress(t *testing.T) {
	ln := reservePort(t)
	addr := ln.Addr().String()
	_ = ln.Close()
	_, err := Connect(testCtx(t), addr, &Options{ConnectTimeout: time.Second})
	var ce *ConnectError
	if !errors.As(err, &ce) || ce.Attempts[0].Addr != addr || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("connect to nothing: %v", err)
	}
}

// Two single servers share no locks: given as a list, the client moved to
// the second when the first was down and locked there, beside a holder of
// the same key on the first. A list must name one cluster's nodes (as the
// Rust client's src/dial.rs has it).
func TestAListThatLeadsToASingleServerIsRefused(t *testing.T) {
	first, second := startServer(t, ""), startServer(t, "")
	ln := reservePort(t)
	down := ln.Addr().String()
	_ = ln.Close()
	for _, list := range []string{down + "," + second.Addr, first.Addr + "," + second.Addr} {
		c, err := Connect(testCtx(t), list, &Options{ConnectTimeout: 5 * time.Second})
		if err == nil {
			_ = c.Close()
		}
		var nc *NotOneClusterError
		if !errors.As(err, &nc) || !errors.Is(err, ErrNotOneCluster) {
			t.Fatalf("%s: want a NotOneClusterError, got %v", list, err)
		}
		if want := "dlock: " + nc.Addr + " is a single server"; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "alone") {
			t.Fatalf("%s: %v", list, err)
		}
		if nc.Addr != first.Addr && nc.Addr != second.Addr {
			t.Fatalf("%s: names %s", list, nc.Addr)
		}
	}
	// One address is a single server's, as always.
	alone := connect(t, second.Addr, nil)
	if _, err := alone.Ping(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}
