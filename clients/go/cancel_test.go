package dlock

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "dlock/clients/go/dlockpb"
)

// checkCancelWithdraws: a Lock waiting without a deadline on a held key is
// cancelled; the server withdraws it at once, the client's other calls are
// answered while the key is still held, and the next in line gets the key
// as soon as the holder lets go.
func checkCancelWithdraws(t *testing.T, servers string, opts *LockOptions) {
	ctx := testCtx(t)
	holder := connect(t, servers, nil)
	waiter := connect(t, servers, nil)
	third := connect(t, servers, nil)
	key := "cancel/" + t.Name()
	held, err := holder.Lock(ctx, []string{key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waiters := func() uint32 {
		info, err := holder.Inspect(ctx, []string{key})
		if err != nil {
			t.Fatal(err)
		}
		return info[0].Waiters
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := waiter.Lock(wctx, []string{key}, opts)
		errc <- err
	}()
	waitFor(t, "the Lock waits in line", func() bool { return waiters() == 1 })
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Lock: %v, want context.Canceled", err)
		}
	case <-time.After(limit):
		t.Fatal("cancelled Lock did not return")
	}
	// (a) The server withdraws the request.
	waitFor(t, "the cancelled request is withdrawn", func() bool { return waiters() == 0 })
	// (b) Nothing on the waiter's Client is held back behind it.
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	if _, err := waiter.Ping(pctx); err != nil {
		t.Fatalf("Ping after the cancelled Lock: %v", err)
	}
	if err := held.Check(); err != nil {
		t.Fatalf("the holder lost its lock: %v", err)
	}
	// (c) Nothing stands between the holder and the next one.
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := third.Lock(ctx, []string{key}, &LockOptions{Try: true})
	if err != nil {
		t.Fatalf("a third client after the unlock: %v (want the key at once)", err)
	}
	if err := got.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The waiter's Client still takes locks, waiting ones too.
	again, err := waiter.Lock(ctx, []string{key}, &LockOptions{Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCancellingAWaitingLockWithdrawsIt(t *testing.T) {
	s := startServer(t, "")
	checkCancelWithdraws(t, s.Addr, nil)
	t.Run("Lease", func(t *testing.T) { checkCancelWithdraws(t, s.Addr, &LockOptions{Lease: time.Minute}) })
}

func TestCancellingAWaitingLockWithdrawsItOnACluster(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3, "--session-ttl", "6s")
	checkCancelWithdraws(t, cl.Servers(), nil)
}

// A Lock that waits is granted on a connection of its own: it keeps the
// key, a Lock of another goroutine of the same Client waits for it, and
// closing the Client releases it.
func TestAWaitedLockIsHeldOnAConnectionOfItsOwn(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	holder := connect(t, s.Addr, nil)
	c := connect(t, s.Addr, nil)
	key := "aside"
	held, err := holder.Lock(ctx, []string{key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lock, 1)
	go func() {
		l, err := c.Lock(ctx, []string{key}, nil)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, "in line", func() bool {
		info, err := holder.Inspect(ctx, []string{key})
		return err == nil && info[0].Waiters == 1
	})
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		t.FailNow()
	}
	if _, err := c.Lock(ctx, []string{key}, &LockOptions{Try: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("the same Client's Try on a key its waited Lock holds: %v, want ErrBusy", err)
	}
	if err := l.Renew(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(); err != nil {
		t.Fatalf("after Unlock: %v", err)
	}
	l2, err := holder.Lock(ctx, []string{key}, &LockOptions{Try: true})
	if err != nil {
		t.Fatalf("after the waited Lock's Unlock: %v", err)
	}
	_ = l2.Unlock(ctx)
	_ = c.Close()
	select {
	case <-c.Done():
	case <-time.After(limit):
		t.Fatal("Close")
	}
}

// A lease granted while its Lock is being cancelled (the grant crosses the
// cancel) is released all the same: the key is free again long before the
// lease of a minute could end. Raced many times over.
func TestALeaseGrantedAsItsLockIsCancelledIsReleased(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	holder, waiter, third := connect(t, s.Addr, nil), connect(t, s.Addr, nil), connect(t, s.Addr, nil)
	key := []string{"crossing"}
	for i := 0; i < 20; i++ {
		held, err := holder.Lock(ctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		got := make(chan *Lock, 1)
		go func() {
			l, _ := waiter.Lock(wctx, key, &LockOptions{Lease: time.Minute})
			got <- l
		}()
		waitFor(t, "in line", func() bool {
			info, err := third.Inspect(ctx, key)
			return err == nil && info[0].Waiters == 1
		})
		go func() { _ = held.Unlock(ctx) }()
		cancel()
		if l := <-got; l != nil {
			// The grant won the race: an ordinary Lock.
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "the key free again", func() bool {
			l, err := third.Lock(ctx, key, &LockOptions{Try: true})
			if err != nil {
				return false
			}
			return l.Unlock(ctx) == nil
		})
	}
}

// lateGrant is the stage of the tests below: a key that another client
// holds, and client c, behind a forwarder the test freezes, about to wait
// for it with an hour's lease, so that a grant the client loses is
// unmistakable.
type lateGrant struct {
	t     *testing.T
	ctx   context.Context
	fw    *forwarder
	other *Client
	key   []string
	held  *Lock
	c     *Client // the forwarder's connection 0
}

func newLateGrant(t *testing.T, key string) *lateGrant {
	s := startServer(t, "")
	g := &lateGrant{t: t, ctx: testCtx(t), fw: startForwarder(t, s.Addr), key: []string{key}}
	g.other = connect(t, s.Addr, nil)
	held, err := g.other.Lock(g.ctx, g.key, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.held = held
	g.c = connect(t, g.fw.Addr, nil)
	return g
}

func (g *lateGrant) info() KeyInfo {
	i, err := g.other.Inspect(g.ctx, g.key)
	if err != nil {
		g.t.Fatal(err)
	}
	return i[0]
}

// lock has c wait for the key with the lease, under ctx: tried on the
// client's connection, then waiting on a connection of its own.
func (g *lateGrant) lock(ctx context.Context) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := g.c.Lock(ctx, g.key, &LockOptions{Lease: time.Hour})
		errc <- err
	}()
	waitFor(g.t, "the Lock waits in line", func() bool { return g.info().Waiters == 1 })
	return errc
}

// grant freezes the forwarder and has the holder unlock: the server grants
// the lease to c's waiting request, and the grant waits in the forwarder.
func (g *lateGrant) grant() {
	g.fw.freeze()
	if err := g.held.Unlock(g.ctx); err != nil {
		g.t.Fatal(err)
	}
	waitFor(g.t, "the grant", func() bool { return g.info().Waiters == 0 })
	if h := g.info().First(); h == nil || h.Fence <= g.held.Fence() {
		g.t.Fatalf("after the unlock of fence %d: %+v", g.held.Fence(), h)
	}
}

// close starts c.Close (its FIN waits in the forwarder too); the channel
// is closed when Close returns.
func (g *lateGrant) close() <-chan struct{} {
	closed := make(chan struct{})
	go func() {
		_ = g.c.Close()
		close(closed)
	}()
	return closed
}

// thawUntil thaws the forwarder and waits for Close to return.
func (g *lateGrant) thawUntil(closed <-chan struct{}) {
	g.fw.thaw()
	select {
	case <-closed:
	case <-time.After(limit):
		g.t.Fatal("Close did not return")
	}
}

// keyFree requires the key free, within a wait far shorter than the lease.
func (g *lateGrant) keyFree() {
	l, err := g.other.Lock(g.ctx, g.key, &LockOptions{Wait: 5 * time.Second})
	if err != nil {
		g.t.Fatalf("the key: %v (the late lease %+v is still held)", err, g.info().First())
	}
	_ = l.Unlock(g.ctx)
}

// A lease granted as its Lock, waiting on a connection of its own, is
// cancelled, after the client's connection ended (the Lock's connection
// outlives it), is released by fence on a connection opened for the Unlock:
// the key is free long before the lease of an hour could end.
func TestALeaseGrantedAsItsLockIsCancelledIsReleasedAfterTheClientsConnectionEnded(t *testing.T) {
	g := newLateGrant(t, "late")
	wctx, cancel := context.WithCancel(g.ctx)
	defer cancel()
	errc := g.lock(wctx)
	g.fw.reset(0)
	select {
	case <-g.c.Done():
	case <-time.After(limit):
		t.Fatal("the client's connection did not end")
	}
	g.grant()
	cancel() // the Lock's connection is half-closed
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Lock: %v", err)
	}
	g.fw.thaw()
	waitFor(t, "the late lease released", func() bool {
		i, err := g.other.Inspect(g.ctx, g.key)
		return err == nil && i[0].First() == nil
	})
}

// As above, but the client is closed while the grant is on its way: Close
// leaves the cancelled Lock's connection to read the grant, and returns
// only once the lease was released by fence on a connection opened for it.
func TestALeaseGrantedAsItsLockIsCancelledIsReleasedBeforeCloseReturns(t *testing.T) {
	g := newLateGrant(t, "late-close")
	wctx, cancel := context.WithCancel(g.ctx)
	defer cancel()
	errc := g.lock(wctx)
	g.grant()
	cancel() // the Lock's connection is half-closed (the FIN waits in the forwarder too)
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Lock: %v", err)
	}
	g.thawUntil(g.close())
	if h := g.info().First(); h != nil {
		t.Fatalf("the late lease is still held after Close returned: %+v", h)
	}
}

// A lease granted to a Lock that still waits as its Client is closed (the
// grant crosses the close) is released before Close returns: Close
// half-closes the waiting Lock's connection and reads on, as a cancel does,
// and the Lock fails as before, with the client's connection lost.
func TestALeaseGrantedAsItsClientIsClosedIsReleasedBeforeCloseReturns(t *testing.T) {
	g := newLateGrant(t, "late-close-waiting")
	errc := g.lock(g.ctx)
	g.grant()
	closed := g.close()
	if err := <-errc; !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("the Lock waiting as its Client is closed: %v, want ErrConnectionLost", err)
	}
	g.thawUntil(closed)
	g.keyFree()
}

// A lease granted to a Wait that still waits on the client's connection as
// the Client is closed (the grant crosses the close) is released before
// Close returns: Close half-closes the client's connection and reads on,
// as it does a waiting Lock's own, and the Wait fails as before, with the
// client's connection lost.
func TestALeaseGrantedOnTheClientsConnectionAsItIsClosedIsReleasedBeforeCloseReturns(t *testing.T) {
	g := newLateGrant(t, "late-close-shared")
	c := g.c
	_, q, err := c.Enqueue(g.ctx, g.key, &LockOptions{Lease: time.Hour})
	if err != nil || q == nil || q.ln != c.l {
		t.Fatalf("Enqueue: %v, %+v: want queued on the client's connection", err, q)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := q.Wait(g.ctx)
		errc <- err
	}()
	waitFor(t, "the Wait is sent", func() bool {
		c.l.mu.Lock()
		defer c.l.mu.Unlock()
		for _, p := range c.l.pend {
			if p.kind == pb.RequestType_Wait {
				return len(c.l.out) == 0
			}
		}
		return false
	})
	// Granted to the queued request; the answer to its Wait waits in the
	// forwarder.
	g.grant()
	closed := g.close()
	if err := <-errc; !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("the Wait waiting as its Client is closed: %v, want ErrConnectionLost", err)
	}
	g.thawUntil(closed)
	g.keyFree()
}
