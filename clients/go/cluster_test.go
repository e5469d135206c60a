package dlock

// The client against real three-node clusters: leaders paused, deposed and
// killed. Every wait is bounded and waits for an event the client or the
// cluster reports; nothing sleeps and hopes.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	pb "dlock/clients/go/dlockpb"
)

// ttl of the test clusters' sessions: a paused leader must be replaced, and
// the session resumed, well within a lock's deadline on a loaded machine.
const ttl = 6 * time.Second

// events collects a client's OnEvent calls.
type events chan Event

func (e events) on(ev Event) {
	select {
	case e <- ev:
	default:
	}
}

// next waits for the next event of kind about another node than not.
func (e events) next(t *testing.T, kind EventKind, not string) Event {
	t.Helper()
	timeout := time.After(limit)
	for {
		select {
		case ev := <-e:
			if ev.Kind == kind && ev.Addr != not {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %v event within %v", kind, limit)
		}
	}
}

func TestOnlyAnswersOfCommittedCommandsProveASessionAlive(t *testing.T) {
	proving := map[[2]int32]bool{}
	for _, p := range [][2]int32{
		{int32(pb.RequestType_Ping), int32(pb.ResponseStatus_Ok)},
		{int32(pb.RequestType_Lock), int32(pb.ResponseStatus_Ok)},
		{int32(pb.RequestType_Unlock), int32(pb.ResponseStatus_Ok)},
		{int32(pb.RequestType_Renew), int32(pb.ResponseStatus_Ok)},
		{int32(pb.RequestType_Enqueue), int32(pb.ResponseStatus_Ok)},
		{int32(pb.RequestType_Lock), int32(pb.ResponseStatus_AcquireTimeout)},
		{int32(pb.RequestType_Enqueue), int32(pb.ResponseStatus_AcquireTimeout)},
		{int32(pb.RequestType_Enqueue), int32(pb.ResponseStatus_Queued)},
		{int32(pb.RequestType_Unlock), int32(pb.ResponseStatus_NotHeld)},
		{int32(pb.RequestType_Renew), int32(pb.ResponseStatus_NotHeld)},
	} {
		proving[p] = true
	}
	for k := range pb.RequestType_name {
		for s := range pb.ResponseStatus_name {
			want := proving[[2]int32{k, s}]
			if got := movesDeadline(true, pb.RequestType(k), pb.ResponseStatus(s)); got != want {
				t.Errorf("%v answered %v: %v, want %v", pb.RequestType(k), pb.ResponseStatus(s), got, want)
			}
		}
	}
}

func TestSilenceLimitFollowsTheRustLibrary(t *testing.T) {
	for _, c := range []struct{ election, ttl, want time.Duration }{
		{0, 10 * time.Second, 1500 * time.Millisecond},
		{500 * time.Millisecond, 10 * time.Second, 1500 * time.Millisecond},
		{time.Second, 20 * time.Second, 3 * time.Second},
		{time.Second, 4 * time.Second, time.Second},
	} {
		if got := silenceLimit(c.election, c.ttl); got != c.want {
			t.Errorf("silenceLimit(%v, %v) = %v, want %v", c.election, c.ttl, got, c.want)
		}
	}
}

func TestAClusterClientFollowsNotLeaderAndOpensASession(t *testing.T) {
	// Not parallel: it covers NotLeader before TestEveryStatusOfTheProtoHasATest.
	covers(t, pb.ResponseStatus_NotLeader)
	cl := startCluster(t, 3, "--session-ttl", "6s")
	lead := cl.leader(-1)
	follower := (lead + 1) % 3
	// A follower answers NotLeader, naming the leader.
	resp, err := rawCall(cl.Addrs[follower], &pb.Request{Version: 2, Id: 1, Type: pb.RequestType_OpenSession}, limit)
	if err != nil || resp.Status != pb.ResponseStatus_NotLeader || resp.LeaderAddr != cl.Addrs[lead] {
		t.Fatalf("OpenSession on a follower: %v %v", resp, err)
	}
	if e := errorOf(pb.RequestType_OpenSession, resp); !errors.Is(e, ErrNotLeader) {
		t.Fatalf("NotLeader as an error: %v", e)
	}
	c := connect(t, cl.Addrs[follower], nil)
	if c.Addr() != cl.Addrs[lead] || c.Session() == 0 || c.Limits().SessionTimeout != 6*time.Second || !c.Limits().ResumableSessions {
		t.Fatalf("addr %s session %d limits %+v", c.Addr(), c.Session(), c.Limits())
	}
	ctx := testCtx(t)
	l, err := c.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	other := connect(t, cl.Servers(), nil)
	if _, err := other.Lock(ctx, []string{"k"}, &LockOptions{Try: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("sessions do not exclude each other: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAKilledLeaderIsRiddenThroughWithLocksAndPlacesInLineKept(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3, "--session-ttl", "6s")
	old := cl.leader(-1)
	ctx := testCtx(t)
	ev := make(events, 64)
	holder := connect(t, cl.Servers(), &Options{OnEvent: ev.on})
	first, second := connect(t, cl.Servers(), nil), connect(t, cl.Servers(), nil)
	l, err := holder.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		l   *Lock
		err error
	}
	waitIn := func(c *Client, n uint32) chan grant {
		ch := make(chan grant, 1)
		go func() {
			l, err := c.Lock(ctx, []string{"k"}, nil)
			ch <- grant{l, err}
		}()
		waitFor(t, fmt.Sprintf("%d in line", n), func() bool {
			info, err := holder.Inspect(ctx, []string{"k"})
			return err == nil && info[0].Waiters == n
		})
		return ch
	}
	g1 := waitIn(first, 1)
	g2 := waitIn(second, 2)
	cl.kill(old)
	ev.next(t, Resumed, cl.Addrs[old])
	if _, err := holder.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(); err != nil {
		t.Fatalf("the holder's lock: %v", err)
	}
	// The waiting Locks were sent again under their numbers: still two in
	// line, and the holder still holds.
	waitFor(t, "both waiters back in line", func() bool {
		info, err := holder.Inspect(ctx, []string{"k"})
		return err == nil && info[0].Waiters == 2 && info[0].First().Fence == l.Fence() && info[0].First().HeldByCaller
	})
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-g1
	if a.err != nil || a.l.Fence() <= l.Fence() {
		t.Fatalf("first waiter: %v", a.err)
	}
	select {
	case <-g2:
		t.Fatal("the second waiter was granted while the first held")
	default:
	}
	_ = a.l.Unlock(ctx)
	if b := <-g2; b.err != nil {
		t.Fatal(b.err)
	} else {
		_ = b.l.Unlock(ctx)
	}
}

func TestAPausedLeaderIsNoticedByTheProbeAndCostsTheHolderNothing(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3, "--session-ttl", "6s")
	old := cl.leader(-1)
	ctx := testCtx(t)
	ev := make(events, 64)
	holder := connect(t, cl.Servers(), &Options{OnEvent: ev.on})
	if holder.Addr() != cl.Addrs[old] {
		t.Fatalf("connected to %s, the leader is %s", holder.Addr(), cl.Addrs[old])
	}
	l, err := holder.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A Lock waiting on the same connection holds back every answer
	// (pings included): only the probe can tell the node is silent.
	blocker := connect(t, cl.Servers(), nil)
	bl, err := blocker.Lock(ctx, []string{"b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		wl, err := holder.Lock(ctx, []string{"b"}, nil)
		if err == nil {
			err = wl.Unlock(ctx)
		}
		waiting <- err
	}()
	waitFor(t, "the Lock waits", func() bool {
		info, err := blocker.Inspect(ctx, []string{"b"})
		return err == nil && info[0].Waiters == 1
	})
	paused := time.Now()
	cl.pause(old)
	resumed := ev.next(t, Resumed, cl.Addrs[old])
	cl.resume(old)
	if resumed.Session != holder.Session() {
		t.Fatalf("resumed session %d, holder's %d", resumed.Session, holder.Session())
	}
	if took := time.Since(paused); took > ttl {
		t.Fatalf("the session moved after %v, past its TTL", took)
	}
	if err := l.Check(); err != nil {
		t.Fatalf("lost: %v", err)
	}
	if err := bl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestADeposedLeaderNeverLeavesALockHeldHereThatTheClusterGaveAway(t *testing.T) {
	t.Parallel()
	// A leader paused until the others replace it, then resumed, answers
	// the Pings that queued up with NotLeader. Those answers must not keep
	// the lock "held" here: either the holder resumes its session on the
	// new leader and keeps the lock, or it counts the lock lost before
	// anyone else is granted it. The holder knows the old leader's address
	// alone, so it finds the new one only once the old one answers again.
	cl := startCluster(t, 3, "--session-ttl", "6s")
	old := cl.leader(-1)
	ctx := testCtx(t)
	ev := make(events, 64)
	holder := connect(t, cl.Addrs[old], &Options{OnEvent: ev.on})
	l, err := holder.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl.pause(old)
	next := cl.leader(old)
	cl.resume(old)
	other := connect(t, cl.Addrs[next], nil)
	taken := make(chan *Lock, 1)
	go func() {
		tl, err := other.Lock(ctx, []string{"k"}, &LockOptions{Wait: 3 * ttl})
		if err == nil {
			taken <- tl
		}
	}()
	select {
	case tl := <-taken:
		if l.Check() == nil {
			t.Fatalf("k was granted to another client while the holder's lock was not lost")
		}
		_ = tl.Unlock(ctx)
	case <-l.Lost():
		// Lost before anyone else was granted it: safe.
	case <-waitEvent(ev, Resumed, cl.Addrs[old]):
		if _, err := holder.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Check(); err != nil {
			t.Fatalf("resumed, yet lost: %v", err)
		}
		info, err := holder.Inspect(ctx, []string{"k"})
		if err != nil || info[0].First().Fence != l.Fence() || !info[0].First().HeldByCaller {
			t.Fatalf("after the resume: %+v %v", info, err)
		}
		_ = l.Unlock(ctx)
	case <-time.After(limit):
		t.Fatal("nothing happened")
	}
}

func waitEvent(ev events, kind EventKind, not string) <-chan Event {
	ch := make(chan Event, 1)
	go func() {
		for e := range ev {
			if e.Kind == kind && e.Addr != not {
				ch <- e
				return
			}
		}
	}()
	return ch
}

func TestWithEveryNodeDownTheLockIsLostAndTheErrorNamesEachNode(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3, "--session-ttl", "2s")
	cl.leader(-1)
	ctx := testCtx(t)
	c := connect(t, cl.Servers(), nil)
	l, err := c.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cl.nodes {
		cl.kill(i)
	}
	<-l.Lost()
	select {
	case <-c.Done():
	case <-time.After(limit):
		t.Fatal("the client did not end")
	}
	_, err = c.Ping(ctx)
	if !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("after the end: %v", err)
	}
	var ce *ConnectError
	if !errors.As(c.Err(), &ce) || len(ce.Attempts) != 3 {
		t.Fatalf("the end names every node: %v", c.Err())
	}
	_ = context.Background()
}
