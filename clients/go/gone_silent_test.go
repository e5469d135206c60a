package dlock

// The silent-node probe's link rule (goneSilent, as rules::gone_silent in
// src/rules.rs): when the probe finds a node silent, a link on it that has
// itself heard from the node within the silence limit stays, and only one
// that heard nothing for the whole limit breaks off and resumes elsewhere;
// one that stayed goes once it too has heard nothing for the limit, unless
// the probe was answered since, without waiting for the probe's next
// report. Fake nodes over real TCP; the tests wait on the probe's reports
// and its connections' ends, not on the clock.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	pb "dlock/clients/go/dlockpb"
)

// shortTTL makes the silence limit a quarter of it, 1.5 s, as the fakes'
// 300 ms election timeout asks (at least 1.5 s): long enough that a test
// process stalled a few hundred milliseconds at the probe's report does not
// make a link that hears every 20 ms look silent.
const shortTTL = 6 * time.Second

// shortLeader is fakeLeader with sessions of shortTTL.
func shortLeader(first uint64) func(fc *fakeConn, req *pb.Request) *pb.Response {
	opens := fakeLeader(first)
	return func(fc *fakeConn, req *pb.Request) *pb.Response {
		resp := opens(fc, req)
		switch req.Type {
		case pb.RequestType_Hello:
			resp.Limits.SessionTimeoutMicro = toMicros(shortTTL)
		case pb.RequestType_OpenSession:
			resp.SessionTtlMicro = toMicros(shortTTL)
		}
		return resp
	}
}

// silences is how many times the client's probe of addr reported the node
// silent and told every link on it.
func silences(c *Client, addr string) int {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	if w := c.d.watches[addr]; w != nil {
		return w.silences
	}
	return 0
}

func TestOnASilentNodeOnlyTheLinkThatHeardNothingForTheLimitResumesElsewhere(t *testing.T) {
	// Node a never answers a Lock that waits, and once the Lock waits it
	// stops answering its probe's Pings (a probe connection slowed down,
	// as on a new leader flooded with resumes). The client's own
	// connection keeps hearing from a (the test's Pings): it must stay.
	// The Lock's connection of its own hears nothing while its Lock waits:
	// it must resume on b, where the Lock is granted.
	release, quiet := make(chan struct{}), make(chan struct{})
	opens := shortLeader(1)
	a := startFake(t, func(fc *fakeConn, req *pb.Request) *pb.Response {
		switch {
		case req.Type == pb.RequestType_Ping && fc.session == 0:
			select {
			case <-quiet:
				<-release
				return nil
			default:
			}
		case req.Type == pb.RequestType_Lock && !req.Lock.GetTryLock():
			<-release
			return nil
		case req.Type == pb.RequestType_Lock:
			return &pb.Response{Status: pb.ResponseStatus_AcquireTimeout}
		}
		return opens(fc, req)
	})
	t.Cleanup(func() { close(release) })
	others := shortLeader(100)
	b := startFake(t, func(fc *fakeConn, req *pb.Request) *pb.Response {
		if req.Type == pb.RequestType_Lock {
			return &pb.Response{Status: pb.ResponseStatus_Ok, Fence: 42}
		}
		return others(fc, req)
	})
	ctx := testCtx(t)
	ev := make(events, 64)
	c := connect(t, a.Addr+","+b.Addr, &Options{OnEvent: ev.on})
	if c.Addr() != a.Addr || c.l.silenceLimit != shortTTL/4 {
		t.Fatalf("on %s with a silence limit of %v", c.Addr(), c.l.silenceLimit)
	}
	c.l.mu.Lock()
	first := c.l.cur
	c.l.mu.Unlock()

	// The client's connection hears from a every 20 ms, well within the
	// 1.5 s limit, until the test has seen what it waits for.
	stop := make(chan struct{})
	pinged := keepHearing(ctx, c, func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	})

	got := make(chan grant, 1)
	go func() {
		l, err := c.Lock(ctx, []string{"k"}, nil)
		got <- grant{l, err}
	}()
	// Only now is a found silent: the Lock's connection heard from a
	// before its Lock was sent, so by the first report it has heard
	// nothing for the whole limit.
	waitFor(t, "the Lock waits on a", func() bool {
		for _, r := range a.requests(pb.RequestType_Lock) {
			if !r.Lock.GetTryLock() {
				return true
			}
		}
		return false
	})
	if silences(c, a.Addr) != 0 || c.d.isSuspect(a.Addr) {
		t.Fatal("a was found silent before the test made it so")
	}
	close(quiet)
	var g grant
	select {
	case g = <-got:
	case <-time.After(limit):
		t.Fatal("the Lock waiting on the silent node was never granted")
	}
	if g.err != nil {
		t.Fatalf("the Lock: %v", g.err)
	}
	if g.l.Fence() != 42 {
		t.Fatalf("the Lock's fence %d, want b's 42", g.l.Fence())
	}
	// Its connection's session was resumed on b, and only it.
	var resumed []uint64
	for _, r := range b.requests(pb.RequestType_OpenSession) {
		resumed = append(resumed, r.Session)
	}
	if len(resumed) != 1 || resumed[0] == 0 || resumed[0] == c.Session() {
		t.Fatalf("b was asked to open sessions %v; the client's is %d", resumed, c.Session())
	}
	// Only the probe can have moved it: a Lock may wait for ever. Each
	// report tells every link on a, the client's connection too: wait
	// until one has told them all.
	waitFor(t, "the probe's report told every link", func() bool { return silences(c, a.Addr) >= 1 })
	close(stop)
	if pingErr := pinged(); pingErr != nil {
		t.Fatalf("a Ping on the client's connection: %v", pingErr)
	}
	c.l.mu.Lock()
	same, addr := c.l.cur == first, c.l.addr
	c.l.mu.Unlock()
	if !same || addr != a.Addr {
		t.Fatalf("the client's connection, which kept hearing from a, broke off (now on %s)", addr)
	}
	if !c.d.isSuspect(a.Addr) {
		t.Fatal("a, found silent, is not tried last")
	}
	// (The Lock's connection of its own says nothing of its moves.)
	for len(ev) > 0 {
		if e := <-ev; e.Kind == Reconnecting || e.Kind == Resumed {
			t.Fatalf("the client's connection moved: %+v", e)
		}
	}
	if err := g.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d silence reports of a; the Lock's connection moved, the client's stayed", silences(c, a.Addr))
}

func TestALinkThatOutlivedASilenceReportLeavesOnceItHearsNothingForTheLimit(t *testing.T) {
	// Node a answers its probe's Hello, never a Ping: a limit (1.5 s)
	// after the first Ping the probe reports it silent and ends its
	// connection. Until then the client's connection hears from a (the
	// test's Pings, 20 ms apart), so it stays; from then on a stalls whole
	// and answers nothing, on the client's connection or on a new probe's.
	// The connection must leave a once it has heard nothing for the
	// limit, within a limit of the report; the probe's next report comes
	// only after its retry pause and a whole limit more, which is what the
	// link waited for before. (The probe's connections that ended cannot
	// tell the reports apart: the link leaving a stops the probe, which
	// ends its second connection too. The probe's own count of reports
	// can: a stopped probe reports nothing.)
	opens := fakeLeader(1)
	a := startFake(t, func(fc *fakeConn, req *pb.Request) *pb.Response {
		stalled := fc.node.probesEnded() > 0
		if stalled || req.Type == pb.RequestType_Ping && fc.session == 0 {
			return noAnswer
		}
		return opens(fc, req)
	})
	// How many times the probe of a had reported it silent when the
	// session came to be resumed on b.
	var probe struct {
		sync.Mutex
		reports func() int
	}
	atResume := make(chan int, 4)
	others := fakeLeader(100)
	b := startFake(t, func(fc *fakeConn, req *pb.Request) *pb.Response {
		if req.Type == pb.RequestType_OpenSession && req.Session != 0 {
			probe.Lock()
			atResume <- probe.reports()
			probe.Unlock()
		}
		return others(fc, req)
	})
	ctx := testCtx(t)
	ev := make(events, 64)
	c := connect(t, a.Addr+","+b.Addr, &Options{OnEvent: ev.on})
	if c.Addr() != a.Addr || c.l.silenceLimit != 1500*time.Millisecond {
		t.Fatalf("on %s with a silence limit of %v", c.Addr(), c.l.silenceLimit)
	}
	c.l.mu.Lock()
	first := c.l.cur
	c.l.mu.Unlock()
	// Kept past the link's leaving a, which takes it out of the client's
	// watches.
	c.d.mu.Lock()
	w := c.d.watches[a.Addr]
	c.d.mu.Unlock()
	probe.Lock()
	probe.reports = func() int {
		c.d.mu.Lock()
		defer c.d.mu.Unlock()
		return w.silences
	}
	probe.Unlock()

	// (A Ping sent as a stalls is answered once resumed on b.)
	pinged := keepHearing(ctx, c, func() bool { return a.probesEnded() != 0 })
	// The report told every link, and the client's, which had just heard
	// from a, stayed.
	waitFor(t, "the probe's first report", func() bool { return silences(c, a.Addr) >= 1 })
	c.l.mu.Lock()
	stayed := c.l.cur == first
	c.l.mu.Unlock()
	if !stayed {
		t.Fatal("the client's connection, which had just heard from a, broke off at the probe's report")
	}
	select {
	case n := <-atResume:
		if n != 1 {
			t.Fatalf("the session was resumed on b only after %d reports of the probe, not at its first recheck", n)
		}
	case <-time.After(limit):
		t.Fatal("the session was never resumed on b")
	}
	broke := ev.next(t, Reconnecting, "")
	if broke.Addr != a.Addr || !strings.Contains(broke.Reason, "heard nothing from it") {
		t.Fatalf("broke off %+v", broke)
	}
	resumed := ev.next(t, Resumed, a.Addr)
	if resumed.Addr != b.Addr || resumed.Session != 1 || c.Addr() != b.Addr {
		t.Fatalf("resumed %+v; now on %s", resumed, c.Addr())
	}
	if pingErr := pinged(); pingErr != nil {
		t.Fatalf("a Ping on the client's connection: %v", pingErr)
	}
	// The stream left behind keeps no recheck.
	c.l.mu.Lock()
	left := first.suspect
	c.l.mu.Unlock()
	if left != nil {
		t.Fatal("the stream that broke off is still suspect")
	}
	t.Logf("broke off: %s", broke.Reason)
}

// keepHearing pings on c's connection every 20 ms, so that it keeps hearing
// from its node, until done says to stop; the function it returns waits
// for the pinging to end and returns the error of a Ping that failed.
func keepHearing(ctx context.Context, c *Client, done func() bool) func() error {
	var err error
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for !done() {
			if _, err = c.Ping(ctx); err != nil {
				return
			}
			<-tick.C
		}
	}()
	return func() error {
		<-finished
		return err
	}
}
