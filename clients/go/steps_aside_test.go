package dlock

// A node that cannot serve (issue 45): a leader cut off from its peers
// while its clients still reach it steps aside and answers the clients'
// probe Unavailable; a node stopping on SIGTERM steps aside too, and may
// answer a session's request ShuttingDown. Either way the sessions on it
// go on at the next leader, locks held and places in line kept. Real
// clusters (the peer links through proxies the test freezes), and fake
// nodes for the answers a real node gives only in a race.

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	pb "dlock/clients/go/dlockpb"

	"google.golang.org/protobuf/proto"
)

// fakeNode answers the client's requests as handle says: one goroutine per
// connection, answers in order; a nil answer ends the connection with a
// reset, noAnswer leaves the request unanswered and reads on.
type fakeNode struct {
	Addr   string
	handle func(fc *fakeConn, req *pb.Request) *pb.Response
	mu     sync.Mutex
	seen   []*pb.Request
	// bareEnded counts the connections without a session (a probe's) that
	// the client ended.
	bareEnded int
}

// noAnswer, returned by a fake node's handle, leaves the request
// unanswered: the node says nothing, as a stalled one, yet sees the
// connection end.
var noAnswer = &pb.Response{}

// fakeConn is one connection's state: its node, and the session opened or
// resumed on it (0: none, as on a probe's).
type fakeConn struct {
	node    *fakeNode
	session uint64
}

func startFake(t *testing.T, handle func(fc *fakeConn, req *pb.Request) *pb.Response) *fakeNode {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNode{Addr: ln.Addr().String(), handle: handle}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			go f.serve(conn)
		}
	}()
	return f
}

func (f *fakeNode) serve(conn net.Conn) {
	defer conn.Close()
	rd := bufio.NewReader(conn)
	fc := &fakeConn{node: f}
	for {
		var size [4]byte
		if _, err := io.ReadFull(rd, size[:]); err != nil {
			if fc.session == 0 {
				f.mu.Lock()
				f.bareEnded++
				f.mu.Unlock()
			}
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(rd, body); err != nil {
			return
		}
		req := &pb.Request{}
		if err := proto.Unmarshal(body, req); err != nil {
			return
		}
		f.mu.Lock()
		f.seen = append(f.seen, req)
		f.mu.Unlock()
		resp := f.handle(fc, req)
		if resp == nil {
			reset(conn)
			return
		}
		if resp == noAnswer {
			continue
		}
		if resp.RequestId == 0 {
			resp.RequestId = req.Id
		}
		out, err := proto.Marshal(resp)
		if err != nil {
			panic(err)
		}
		if _, err := conn.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(out))), out...)); err != nil {
			return
		}
	}
}

// probesEnded is how many connections without a session (the client's
// probes, in a test that opens no other) the client ended.
func (f *fakeNode) probesEnded() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bareEnded
}

// requests are the requests of type kind the node was sent.
func (f *fakeNode) requests(kind pb.RequestType) []*pb.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*pb.Request
	for _, r := range f.seen {
		if r.Type == kind {
			out = append(out, r)
		}
	}
	return out
}

// fakeTTL is the fake nodes' session TTL; their election timeout is 300 ms,
// so the probe's silence limit is 1.5 s, a Ping every 0.5 s.
const fakeTTL = 6 * time.Second

func fakeHello(req *pb.Request) *pb.Response {
	return &pb.Response{Status: pb.ResponseStatus_Ok, Limits: &pb.ServerLimits{
		SessionTimeoutMicro: toMicros(fakeTTL), MaxPipeline: 1024, ResumableSessions: true,
		ElectionTimeoutMicro: toMicros(300 * time.Millisecond),
	}}
}

// fakeLeader answers Hello, opens sessions (numbered from first) and
// resumes any, and answers Ok to anything else it is not told about.
func fakeLeader(first uint64) func(fc *fakeConn, req *pb.Request) *pb.Response {
	var mu sync.Mutex
	next := first
	return func(fc *fakeConn, req *pb.Request) *pb.Response {
		switch req.Type {
		case pb.RequestType_Hello:
			return fakeHello(req)
		case pb.RequestType_OpenSession:
			fc.session = req.Session
			if fc.session == 0 {
				mu.Lock()
				fc.session = next
				next++
				mu.Unlock()
			}
			return &pb.Response{Status: pb.ResponseStatus_Ok, Session: fc.session, SessionTtlMicro: toMicros(fakeTTL)}
		}
		return &pb.Response{Status: pb.ResponseStatus_Ok}
	}
}

func TestShuttingDownOnASessionResumesItElsewhereAndTheWaitingLockKeepsItsPlace(t *testing.T) {
	// The old server answered a Lock waiting on a stopping node
	// ShuttingDown; a new one resets the connection, but ShuttingDown can
	// still come (a connection without named sessions, an older server).
	waiting := make(chan *pb.Request, 1)
	stop := make(chan struct{})
	opens := fakeLeader(1)
	a := startFake(t, func(fc *fakeConn, req *pb.Request) *pb.Response {
		if req.Type == pb.RequestType_Lock {
			if req.Lock.GetTryLock() {
				return &pb.Response{Status: pb.ResponseStatus_AcquireTimeout}
			}
			waiting <- req
			<-stop
			return &pb.Response{Status: pb.ResponseStatus_ShuttingDown, ErrorText: "shutting down"}
		}
		return opens(fc, req)
	})
	others := fakeLeader(100)
	b := startFake(t, func(fc *fakeConn, req *pb.Request) *pb.Response {
		if req.Type == pb.RequestType_Lock {
			return &pb.Response{Status: pb.ResponseStatus_Ok, Fence: 42}
		}
		return others(fc, req)
	})
	ctx := testCtx(t)
	c := connect(t, a.Addr+","+b.Addr, nil)
	type grant struct {
		l   *Lock
		err error
	}
	got := make(chan grant, 1)
	go func() {
		l, err := c.Lock(ctx, []string{"k"}, nil)
		got <- grant{l, err}
	}()
	var first *pb.Request
	select {
	case first = <-waiting:
	case <-time.After(limit):
		t.Fatal("the Lock never waited on the first node")
	}
	close(stop)
	var g grant
	select {
	case g = <-got:
	case <-time.After(limit):
		t.Fatal("the Lock never returned")
	}
	if g.err != nil {
		t.Fatalf("ShuttingDown reached the caller: %v", g.err)
	}
	if g.l.Fence() != 42 {
		t.Fatalf("fence %d, want the second node's 42", g.l.Fence())
	}
	// Sent again to the other node in the same session, under the same
	// number: the cluster recognises it and keeps its place in line.
	var again *pb.Request
	for _, r := range b.requests(pb.RequestType_Lock) {
		if r.Session == first.Session {
			again = r
		}
	}
	if again == nil || again.Seq != first.Seq || again.Lock.GetTryLock() || strings.Join(again.Lock.GetKeys(), ",") != "k" {
		t.Fatalf("first sent as %v, then %v", first, again)
	}
	resumed := false
	for _, r := range b.requests(pb.RequestType_OpenSession) {
		resumed = resumed || r.Session == first.Session
	}
	if !resumed {
		t.Fatalf("session %d was not resumed on the second node", first.Session)
	}
	if err := g.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestShuttingDownAtConnectTriesTheNextNode(t *testing.T) {
	// Hello answered ShuttingDown, then OpenSession answered ShuttingDown:
	// the third node opens the session.
	a := startFake(t, func(fc *fakeConn, req *pb.Request) *pb.Response {
		return &pb.Response{Status: pb.ResponseStatus_ShuttingDown, ErrorText: "shutting down"}
	})
	b := startFake(t, func(fc *fakeConn, req *pb.Request) *pb.Response {
		if req.Type == pb.RequestType_OpenSession {
			return &pb.Response{Status: pb.ResponseStatus_ShuttingDown, ErrorText: "shutting down"}
		}
		return fakeHello(req)
	})
	c3 := startFake(t, fakeLeader(7))
	c := connect(t, strings.Join([]string{a.Addr, b.Addr, c3.Addr}, ","), nil)
	if c.Addr() != c3.Addr || c.Session() != 7 {
		t.Fatalf("connected to %s, session %d", c.Addr(), c.Session())
	}
	if c.d.getLeader() != c3.Addr {
		t.Fatalf("leader %q", c.d.getLeader())
	}
}

func TestAProbeAnsweredUnavailableMovesTheSessionAtOnce(t *testing.T) {
	t.Parallel()
	// The node keeps answering the session's own requests (as a leader cut
	// off from its peers would Pings it queued before it stepped aside):
	// only the probe tells that it cannot serve.
	cut := make(chan struct{})
	opens := fakeLeader(9)
	a := startFake(t, func(fc *fakeConn, req *pb.Request) *pb.Response {
		if req.Type == pb.RequestType_Ping && fc.session == 0 {
			select {
			case <-cut:
				return &pb.Response{Status: pb.ResponseStatus_Unavailable, ErrorText: "this node cannot serve"}
			default:
			}
		}
		return opens(fc, req)
	})
	b := startFake(t, fakeLeader(100))
	ctx := testCtx(t)
	ev := make(events, 64)
	c := connect(t, a.Addr+","+b.Addr, &Options{OnEvent: ev.on})
	l, err := c.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The probe answered Ok at least once.
	waitFor(t, "a probe Ping", func() bool {
		for _, r := range a.requests(pb.RequestType_Ping) {
			if r.Session == 0 {
				return true
			}
		}
		return false
	})
	close(cut)
	cutAt := time.Now()
	var moved Event
	select {
	case moved = <-waitEvent(ev, Reconnecting, b.Addr):
	case <-time.After(fakeTTL / 2):
		t.Fatalf("the session stayed on the node that answered its probe Unavailable for %v", fakeTTL/2)
	}
	if !strings.Contains(moved.Reason, "Unavailable") {
		t.Fatalf("moved because %q", moved.Reason)
	}
	resumed := ev.next(t, Resumed, a.Addr)
	if resumed.Addr != b.Addr || resumed.Session != 9 || c.Addr() != b.Addr {
		t.Fatalf("resumed %+v; now on %s", resumed, c.Addr())
	}
	// A Ping every third of the 1.5 s silence limit: noticed within one.
	if took := time.Since(cutAt); took > 1500*time.Millisecond {
		t.Fatalf("moved %v after the probe said Unavailable", took)
	}
	if !c.d.isSuspect(a.Addr) {
		t.Fatal("the node is not tried last")
	}
	if err := l.Check(); err != nil {
		t.Fatal(err)
	}
	t.Logf("moved %v after the node began answering its probe Unavailable", time.Since(cutAt).Round(time.Millisecond))
}

// peerLink is a TCP forwarder on one directed peer link (node a dials node
// b through it) that a test can freeze: while frozen nothing gets through
// either way (no bytes, no FIN, no reset; what was read is held back), and
// both sockets stay open; thawed, what was held back is delivered.
type peerLink struct {
	Addr   string
	mu     sync.Mutex
	frozen bool
	thawed chan struct{}
	done   chan struct{}
}

func startPeerLink(t *testing.T, to string) *peerLink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peerLink{Addr: ln.Addr().String(), thawed: make(chan struct{}), done: make(chan struct{})}
	close(p.thawed)
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		close(p.done)
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", to)
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			go p.pipe(in, out)
			go p.pipe(out, in)
		}
	}()
	return p
}

func (p *peerLink) set(frozen bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if frozen && !p.frozen {
		p.thawed = make(chan struct{})
	} else if !frozen && p.frozen {
		close(p.thawed)
	}
	p.frozen = frozen
}

// gate waits while the link is frozen; false once the test ended.
func (p *peerLink) gate() bool {
	p.mu.Lock()
	thawed := p.thawed
	p.mu.Unlock()
	select {
	case <-thawed:
		return true
	case <-p.done:
		return false
	}
}

func (p *peerLink) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if !p.gate() {
			return
		}
		if n > 0 {
			if _, werr := to.Write(buf[:n]); werr != nil {
				_ = from.Close()
				return
			}
		}
		if err != nil {
			_ = to.Close()
			return
		}
	}
}

// peerLinks: links[a][b] carries what node a sends to node b.
type peerLinks [][]*peerLink

// routePeers puts a peerLink on every directed link of the cluster, which
// must not run yet.
func routePeers(t *testing.T, c *testCluster) peerLinks {
	n := len(c.Addrs)
	links := make(peerLinks, n)
	for from := 0; from < n; from++ {
		links[from] = make([]*peerLink, n)
		for to := 0; to < n; to++ {
			if from == to {
				continue
			}
			p := startPeerLink(t, c.peers[to])
			links[from][to] = p
			c.extra[from] = append(c.extra[from], "--peer-route", fmt.Sprintf("%d=%s", to+1, p.Addr))
		}
	}
	return links
}

// isolate freezes (cut) or thaws every link to and from node i: it is cut
// off from the other nodes, and its clients still reach it.
func (links peerLinks) isolate(i int, cut bool) {
	for from, row := range links {
		for to, p := range row {
			if p != nil && (from == i || to == i) {
				p.set(cut)
			}
		}
	}
}

// cutOffFlags as dlock-client/tests/leader_steps_aside.rs: with an 8 s TTL
// a client that learned of the cut only when its keep-alives failed to
// commit (5 s) would lose its lock; one moved at once by the leader
// stepping aside (after 2 × 300 ms) keeps it.
var cutOffFlags = []string{"--heartbeat", "100ms", "--election-timeout", "300ms", "--session-ttl", "8s"}

// seenByTheOthers is key's first holder's fence and its waiters as a fresh
// client connected only to the nodes other than except sees them, once one
// of them leads.
func seenByTheOthers(t *testing.T, c *testCluster, except int, key string) (uint64, uint32) {
	t.Helper()
	var others []string
	for i, a := range c.Addrs {
		if i != except {
			others = append(others, a)
		}
	}
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		o, err := Connect(ctx, strings.Join(others, ","), &Options{ConnectTimeout: 2 * time.Second})
		if err == nil {
			info, err := o.Inspect(ctx, []string{key})
			_ = o.Close()
			if err == nil {
				cancel()
				var fence uint64
				if h := info[0].First(); h != nil {
					fence = h.Fence
				}
				return fence, info[0].Waiters
			}
		}
		cancel()
		if time.Now().After(deadline) {
			t.Fatalf("no leader among the others within %v: %v", limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// probeStatus is the status of a session-less Ping (the clients' liveness
// probe) on the node at addr.
func probeStatus(addr string) pb.ResponseStatus {
	resp, err := rawCall(addr, &pb.Request{Version: 2, Id: 1, Type: pb.RequestType_Ping}, 2*time.Second)
	if err != nil {
		return pb.ResponseStatus(-1)
	}
	return resp.Status
}

func (c *testCluster) indexOf(addr string) int {
	for i, a := range c.Addrs {
		if a == addr {
			return i
		}
	}
	c.t.Fatalf("%s is no node of the cluster", addr)
	return -1
}

type grant struct {
	l   *Lock
	err error
}

// holderAndWaiter: a holder of key, and a waiter (its own client) in line
// for it, seen there by the holder.
func holderAndWaiter(t *testing.T, ctx context.Context, c *testCluster, key string, opts *Options) (*Client, *Lock, chan grant) {
	t.Helper()
	holder := connect(t, c.Servers(), opts)
	l, err := holder.Lock(ctx, []string{key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waiter := connect(t, c.Servers(), nil)
	got := make(chan grant, 1)
	go func() {
		wl, err := waiter.Lock(ctx, []string{key}, nil)
		got <- grant{wl, err}
	}()
	waitFor(t, "the waiter in line", func() bool {
		info, err := holder.Inspect(ctx, []string{key})
		return err == nil && info[0].Waiters == 1
	})
	return holder, l, got
}

// handOver unlocks l and checks that the waiter gets its key next, with a
// higher fence.
func handOver(t *testing.T, ctx context.Context, l *Lock, got chan grant) {
	t.Helper()
	select {
	case g := <-got:
		t.Fatalf("the waiter's Lock returned while the holder held: %v", g.err)
	default:
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("the holder's Unlock: %v", err)
	}
	select {
	case g := <-got:
		if g.err != nil {
			t.Fatalf("the waiter: %v", g.err)
		}
		if g.l.Fence() <= l.Fence() {
			t.Fatalf("the waiter's fence %d, the holder's %d", g.l.Fence(), l.Fence())
		}
		_ = g.l.Unlock(ctx)
	case <-time.After(limit):
		t.Fatal("the waiter was not granted the key")
	}
}

func TestALeaderCutOffFromItsPeersCostsNoLockAndNoPlaceInLine(t *testing.T) {
	t.Parallel()
	const cutFor = 10 * time.Second // longer than the 8 s TTL
	cl := prepareCluster(t, 3, cutOffFlags)
	links := routePeers(t, cl)
	for i := range cl.Addrs {
		cl.start(i)
	}
	cl.leader(-1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*limit)
	defer cancel()
	ev := make(events, 256)
	holder, l, got := holderAndWaiter(t, ctx, cl, "iso", &Options{OnEvent: ev.on})
	old := cl.indexOf(holder.Addr())
	if s := probeStatus(cl.Addrs[old]); s != pb.ResponseStatus_Ok {
		t.Fatalf("the leader answers the probe %v", s)
	}

	// Only the leader's peer traffic stops: its client port stays reachable.
	links.isolate(old, true)
	cut := time.Now()
	if f, w := seenByTheOthers(t, cl, old, "iso"); f != l.Fence() || w != 1 {
		t.Fatalf("after the election the others see fence %d with %d waiters, want %d with 1", f, w, l.Fence())
	}
	elected := time.Since(cut)
	// The old leader knows it cannot serve, and tells the probe so.
	waitFor(t, "the cut-off leader answers its probe Unavailable", func() bool {
		return probeStatus(cl.Addrs[old]) == pb.ResponseStatus_Unavailable
	})
	broke := ev.next(t, Reconnecting, "")
	resumed := ev.next(t, Resumed, cl.Addrs[old])
	t.Logf("the others led %v after the cut; the holder left %s (%s) and resumed on %s %v after the cut (%v after the break)",
		elected.Round(time.Millisecond), broke.Addr, broke.Reason, resumed.Addr, time.Since(cut).Round(time.Millisecond), resumed.After.Round(time.Millisecond))
	time.Sleep(time.Until(cut.Add(cutFor)))
	if f, w := seenByTheOthers(t, cl, old, "iso"); f != l.Fence() || w != 1 {
		t.Fatalf("a TTL after the cut the others see fence %d with %d waiters, want %d with 1", f, w, l.Fence())
	}
	if err := l.Check(); err != nil {
		t.Fatalf("the holder's lock was reported lost: %v", err)
	}

	// Healed, the old leader follows the one elected without it.
	links.isolate(old, false)
	waitFor(t, "the healed old leader follows the new one", func() bool {
		s := cl.status(old)
		return s != nil && s.LeaderId != 0 && s.LeaderId != uint64(old+1)
	})
	handOver(t, ctx, l, got)
}

func TestALeaderStoppedWithSigtermCostsNoLockAndNoPlaceInLine(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3, "--session-ttl", "6s")
	cl.leader(-1)
	ctx := testCtx(t)
	holder, l, got := holderAndWaiter(t, ctx, cl, "term", nil)
	old := cl.indexOf(holder.Addr())
	stopped := time.Now()
	code, err := cl.terminate(old)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("the leader exited %d on SIGTERM", code)
	}
	t.Logf("the leader exited %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	if f, w := seenByTheOthers(t, cl, old, "term"); f != l.Fence() || w != 1 {
		t.Fatalf("after the leader stopped the others see fence %d with %d waiters, want %d with 1", f, w, l.Fence())
	}
	if err := l.Check(); err != nil {
		t.Fatalf("the holder's lock was reported lost: %v", err)
	}
	handOver(t, ctx, l, got)
}
