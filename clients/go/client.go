package dlock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	pb "dlock/clients/go/dlockpb"
)

// Options are the settings of a Client; the zero value (or nil) takes the
// defaults and the environment.
type Options struct {
	// Token is sent with every request; "" reads DLOCK_TOKEN.
	Token string
	// TLS turns TLS on with this configuration; the server's certificate
	// must name the host dialled. nil reads DLOCK_TLS_CA, DLOCK_TLS_CERT and
	// DLOCK_TLS_KEY (see TLSFromEnv); without DLOCK_TLS_CA, plain TCP.
	TLS *tls.Config
	// ConnectTimeout bounds a connect; given several servers each gets a
	// share of it (at least half a second), so one that accepts and never
	// answers cannot use it all. Default 5 s.
	ConnectTimeout time.Duration
	// SafetyMargin is how long before a lock's safety deadline it is
	// reported lost when no answer from the server moved the deadline: the
	// time its holder gets to stop. At most a quarter of the lease or
	// session timeout is used. Default 2 s.
	SafetyMargin time.Duration
	// MaxInFlight bounds the requests unanswered at once; further calls
	// wait. Default 256 (and never more than the server's max_pipeline).
	MaxInFlight int
	// SessionTTL asked for the client's session on a cluster: how long it
	// outlives a broken connection, from 1 s (a cluster refuses shorter
	// ones) up to the cluster's --max-session-ttl. 0: the cluster's default.
	SessionTTL time.Duration
	// OnEvent is told when the session moves between cluster nodes. It is
	// called on a goroutine of its own.
	OnEvent func(Event)
}

// Client is a connection to a dlock server, or to a cluster's leader with a
// session. Its methods may be called from any number of goroutines: their
// requests are pipelined on the one connection and answered in order.
//
// Each lock has an owner of its own: tasks (threads, goroutines) sharing
// one client that lock the same key take turns, first come first served,
// exactly as separate processes do; unrelated locks share the client's one
// pipelined connection, and a lock whose key another lock of this client
// holds, or that must wait, is taken on a connection of its own.
//
// (The server counts a connection, on a cluster its session, as one owner
// and grants a key that owner holds again at once; so the client never
// sends a Lock for a key that its connection holds or asks for: see Lock.)
//
// Against a single server, when the connection ends every pending call
// fails with a *ConnectionLostError, later calls fail at once, and Done is
// closed: there is no reconnect, since the server released every lock held
// without a lease. Against a cluster, the client resumes its session on
// the new leader through failovers (see Options.OnEvent); it ends only when
// the session does. A node that answers a request of the session
// ShuttingDown, or the client's liveness probe Unavailable (it leads no
// majority), is left the same way: no call fails for it.
//
// A Lock taken on a connection (session) of its own is not lost when the
// client's connection ends, only when its own does or the client is
// closed.
type Client struct {
	l      *link
	d      *dialer
	margin time.Duration
	inFl   int

	mu sync.Mutex
	// claims counts, per key, the Locks, Enqueues and Waits on the
	// client's connection that hold or ask for it (see claim).
	claims map[string]int
	locks  map[*Lock]bool
	// Connections of the client's own: for Watches (a parked Watch holds
	// back the answers behind it) and for Locks; every one open, those
	// idle for the next Watch, and those idle for the next Lock.
	side     map[*link]bool
	watchers []*link
	idle     []*link
	// draining holds the Locks' connections of their own given up while a
	// grant may be on its way (asideFailed): Close waits for them to end.
	draining map[*link]bool
	// releases counts the Unlocks by fence of late grants under way
	// (releaseLate): Close waits for them.
	releases sync.WaitGroup
	// closed: Close was called; no connection is opened after it but for
	// a late grant's release, which Close waits for.
	closed bool
}

// idleWatchers is how many Watch connections are kept for the next Watch.
const idleWatchers = 2

// idleLockers is how many Locks' connections of their own that hold and
// wait for nothing any more are kept for the next Lock that needs one:
// goroutines taking turns on a key would otherwise open one (on a cluster,
// a session) per turn.
const idleLockers = 4

// claim is the keys a request on the client's connection holds or asks
// for, from before it is queued until the connection's owner is known to
// hold and ask for them no more: its refusal, the Unlock of its grant
// queued (requests on one connection are acted on in order), a late
// grant's release queued, or the server's word that the keys are not held.
// While a key is claimed, every other Lock of it goes to a connection of
// its own: on the client's, the server would grant it to the same owner.
type claim struct {
	c    *Client
	keys []string
	once sync.Once
}

// claim claims keys for a request on the client's connection; nil if one
// of them is claimed already.
func (c *Client) claim(keys []string) *claim {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		if c.claims[k] > 0 {
			return nil
		}
	}
	for _, k := range keys {
		c.claims[k]++
	}
	return &claim{c: c, keys: keys}
}

// release gives the keys up, once; nothing for a nil claim (a request on
// a connection of its own).
func (cl *claim) release() {
	if cl == nil {
		return
	}
	cl.once.Do(func() {
		c := cl.c
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, k := range cl.keys {
			if c.claims[k]--; c.claims[k] <= 0 {
				delete(c.claims, k)
			}
		}
	})
}

// Connect connects to servers: one HOST:PORT, or a cluster's nodes as a
// comma-separated list ("" reads DLOCK_SERVER, else DefaultServer). It says
// Hello to learn the server's limits and session timeout and, on a cluster,
// finds the leader (following the others' NotLeader answers) and opens a
// session there.
//
// The error is a *ConnectError naming each address tried and why it
// failed; errors.Is(err, ErrAccessDenied) for a refused token. Given
// several servers, one that is a single server is a *NotOneClusterError
// (ErrNotOneCluster): a list must name one cluster's nodes.
func Connect(ctx context.Context, servers string, opts *Options) (*Client, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	addrs, err := Servers(servers)
	if err != nil {
		return nil, err
	}
	if o.Token == "" {
		o.Token = os.Getenv("DLOCK_TOKEN")
	}
	if o.TLS == nil {
		if o.TLS, err = TLSFromEnv(); err != nil {
			return nil, err
		}
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.SafetyMargin <= 0 {
		o.SafetyMargin = 2 * time.Second
	}
	d := &dialer{
		addrs: addrs, token: o.Token, tls: o.TLS, connectTimeout: o.ConnectTimeout,
		sessionTTL: o.SessionTTL, onEvent: o.OnEvent,
		suspects: map[string]bool{}, watches: map[string]*nodeWatch{},
	}
	l, err := openLink(ctx, d, o.MaxInFlight, false)
	if err != nil {
		return nil, err
	}
	c := &Client{l: l, d: d, margin: o.SafetyMargin, inFl: o.MaxInFlight,
		claims: map[string]int{}, locks: map[*Lock]bool{}, side: map[*link]bool{}, draining: map[*link]bool{}}
	l.mu.Lock()
	l.onEnd = c.onEnd
	ended := l.err
	l.mu.Unlock()
	if ended != nil {
		go c.onEnd(ended, false)
	}
	return c, nil
}

// Limits are what the server said in answer to Hello; on a cluster,
// SessionTimeout is the session's TTL.
func (c *Client) Limits() Limits { return c.l.limits }

// Session is the cluster session the client acts for; 0 on a single server.
func (c *Client) Session() uint64 { return c.l.session }

// Addr is the node the client is connected to now (on a cluster, the leader).
func (c *Client) Addr() string {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return c.l.addr
}

// Done is closed when the connection (on a cluster: the session) has
// ended; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.l.done }

// Err is nil while the client is connected, then why it ended (a
// *ConnectionLostError).
func (c *Client) Err() error { return c.l.failure() }

// Close ends the connection cleanly (on a cluster, the session too): the
// server releases the locks held without a lease. Leases stop being
// renewed and their Locks are reported lost (LostClosed); on the server
// they run until they end or are unlocked by fence.
//
// A Lock, Enqueue or Wait still waiting (it fails with ErrConnectionLost),
// or given up (its ctx ended), whose grant may still be on its way is the
// exception, on the client's connection as on a Lock's own: its connection
// is half-closed, and Close returns only once that connection has ended
// and a grant that arrived on it, a lease too, was released by fence (on a
// connection opened for it), or once the drain limit (10 s) has passed.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	closed := &ConnectionLostError{Reason: "closed by the client"}
	// A request of the client's connection granted as it closes is
	// released as a Lock's own connection's (drainAside); with none
	// waiting the connection is simply closed.
	c.drainAside(c.l, closed)
	c.onEnd(closed, true)
	// Not closed: each ends by itself once the server has closed its side
	// (it withdrew the request) or its drain limit passed, and hands a
	// grant that crossed the cancel or the close to releaseLate before it
	// ends.
	c.mu.Lock()
	draining := make([]*link, 0, len(c.draining))
	for ln := range c.draining {
		draining = append(draining, ln)
	}
	c.mu.Unlock()
	for _, ln := range draining {
		<-ln.done
	}
	c.releases.Wait()
	return nil
}

func (c *Client) onEnd(err error, closing bool) {
	c.mu.Lock()
	// The client's connection, drained by Close, may end reset.
	closing = closing || c.closed
	side := c.side
	idle := map[*link]bool{}
	for _, s := range c.idle {
		idle[s] = true
	}
	c.side, c.watchers, c.idle = map[*link]bool{}, nil, nil
	var locks []*link
	if closing {
		// A Lock's connection of its own may have a Lock waiting, whose
		// grant may cross the close: drained, not closed (drainAside).
		// Marked draining here, with the client's lock held, so that
		// Close, whichever call of onEnd takes them, waits for them.
		for s := range side {
			if s.forLock && !idle[s] {
				delete(side, s)
				c.draining[s] = true
				locks = append(locks, s)
			}
		}
	} else {
		// A Lock's connection of its own is another owner, which lives on
		// (and ends) by itself; the client's Close closes it. Idle ones
		// are of no more use.
		for s := range side {
			if s.forLock && !idle[s] {
				delete(side, s)
				c.side[s] = true
			}
		}
	}
	var lost []*Lock
	for l := range c.locks {
		if l.own && !closing {
			continue
		}
		bound := l.Lease() == 0
		if bound || closing {
			lost = append(lost, l)
		}
	}
	c.mu.Unlock()
	for s := range side {
		s.close("the client's connection ended")
	}
	for _, s := range locks {
		c.drainAside(s, &ConnectionLostError{Reason: "the client's connection ended"})
	}
	for _, l := range lost {
		if closing {
			l.setLost(LostClosed, "the client was closed", err)
		} else {
			// A lease outlives the connection: it is reported lost only
			// when it could have run out (its watchdog).
			l.setLost(LostConnection, err.Error(), err)
		}
	}
}

// LockOptions are the options of a Lock; nil takes the defaults: wait as
// long as ctx allows, exclusive, no lease.
type LockOptions struct {
	// Wait is the longest the server keeps the request in line for busy
	// keys; 0 waits as long as ctx allows (ctx's deadline, if it has one,
	// is sent as the limit, so the server withdraws the request then).
	Wait time.Duration
	// Try fails at once (ErrBusy) if any key is busy.
	Try bool
	// Lease takes the keys as a lease of this length: it outlives the
	// connection and ends unless renewed (Lock.Renew, Lock.KeepAlive).
	// 0: held until unlocked or until the connection (session) ends.
	Lease time.Duration
	// Shared takes every key shared (a reader lock): any number of shared
	// holders at once, or one exclusive holder.
	Shared bool
	// Limit takes every key as a semaphore of Limit holders (implies
	// Shared). Everyone sharing a key must name the same limit.
	Limit uint32
	// Value (at most 1024 bytes) is what Inspect and Watch show for this
	// hold: an election's leader identity.
	Value []byte
}

func lockBody(ctx context.Context, keys []string, o *LockOptions) *pb.RequestLock {
	body := &pb.RequestLock{Keys: keys, ReleaseMicro: toMicros(o.Lease), Value: o.Value}
	if o.Shared || o.Limit > 0 {
		// Only set when asked, so an exclusive Lock is encoded exactly as
		// by every older client.
		body.SharedKeys = keys
		body.Limit = o.Limit
	}
	switch {
	case o.Try:
		body.TryLock = true
	case o.Wait > 0:
		body.WaitMicro = toMicros(o.Wait)
	default:
		if dl, ok := ctx.Deadline(); ok {
			body.WaitMicro = toMicros(time.Until(dl))
			if body.WaitMicro == 0 {
				body.WaitMicro = 1
			}
		}
	}
	return body
}

// Lock takes all keys at once, waiting in line (FIFO) for busy ones as
// opts say, and returns the held Lock with its fencing token.
//
// Errors: ErrTimeout (a *ServerError listing the busy keys) when the wait
// runs out, ErrBusy with opts.Try (also when another Lock of this Client
// holds a key); a *ServerError for invalid keys or a server limit
// (LimitMismatch when the holders agreed on another limit);
// ErrConnectionLost; ctx's error.
//
// Each Lock has an owner of its own. The request is first sent without
// waiting on the client's connection (pipelined with every other call):
// free keys are granted at once. If keys are busy, or another Lock or
// Enqueue of this Client holds or asks for one of them on that connection,
// the Lock is taken (or waits in line) on a connection (on a cluster, a
// session) of its own, so the wait holds back no other call, and the Lock
// it returns is held by that connection; Unlock closes it or keeps it for
// the next such Lock. Goroutines locking the same key so take turns,
// first come first served. A second Lock of a key from the goroutine that
// holds it waits like any other (without a limit, for ever).
//
// If ctx ends while the request waits, Lock returns at once and
// half-closes that connection: the server withdraws the request (on a
// cluster, ends that session), and a grant that crossed the cancel, a
// lease too, is released by fence.
func (c *Client) Lock(ctx context.Context, keys []string, opts *LockOptions) (*Lock, error) {
	var o LockOptions
	if opts != nil {
		o = *opts
	}
	cl := c.claim(keys)
	if cl == nil {
		return c.lockAside(ctx, keys, &o)
	}
	// First without waiting, pipelined on the client's connection: a free
	// key is granted at once.
	t := o
	t.Try = true
	// Taken before the request is queued: never later than the real send
	// time, so deadlines counted from it are on the safe side.
	sent := time.Now()
	resp, queued, err := c.l.callWith(ctx, pb.RequestType_Lock, lockBody(ctx, keys, &t),
		callOpts{lockKeys: keys, settled: cl.release})
	if err == nil {
		return c.granted(ctx, c.l, cl, keys, resp.Fence, o.Lease, sent)
	}
	if !queued {
		cl.release()
	}
	var se *ServerError
	if o.Try || !errors.As(err, &se) || se.Status != pb.ResponseStatus_AcquireTimeout {
		return nil, tryErr(err, o.Try)
	}
	return c.lockAside(ctx, keys, &o)
}

// lockAside takes keys on a connection (on a cluster, a session) of its
// own, as the Rust library takes every lock: a wait holds back no other
// call, and giving it up closes that connection cleanly, so the server
// withdraws the request (or releases a grant that crossed).
func (c *Client) lockAside(ctx context.Context, keys []string, o *LockOptions) (*Lock, error) {
	ln, err := c.asideLink(ctx)
	if err != nil {
		return nil, err
	}
	body := lockBody(ctx, keys, o)
	sent := time.Now()
	resp, err := ln.call(ctx, pb.RequestType_Lock, body, keys)
	if err != nil {
		c.asideFailed(ctx, ln, err)
		return nil, tryErr(err, o.Try)
	}
	return c.granted(ctx, ln, nil, keys, resp.Fence, o.Lease, sent)
}

// asideLink is a connection (on a cluster, a session) of the client's own
// for one Lock: one kept idle, or a new one.
func (c *Client) asideLink(ctx context.Context) (*link, error) {
	if err := c.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	for len(c.idle) > 0 {
		ln := c.idle[len(c.idle)-1]
		c.idle = c.idle[:len(c.idle)-1]
		if ln.failure() == nil {
			c.mu.Unlock()
			return ln, nil
		}
		delete(c.side, ln)
	}
	c.mu.Unlock()
	ln, err := openLink(ctx, c.d, 0, true)
	if err != nil {
		return nil, err
	}
	ln.forLock = true
	c.mu.Lock()
	c.side[ln] = true
	c.mu.Unlock()
	if err := c.Err(); err != nil {
		c.dropSide(ln)
		return nil, err
	}
	return ln, nil
}

// drainLimit bounds how long a Lock's connection of its own, given up,
// waits for a grant that crossed the cancel, and how long that grant's
// release on a connection opened for it may take.
const drainLimit = 10 * time.Second

// asideFailed disposes of a Lock's connection of its own whose request
// failed with err. Given up (ctx ended), it is half-closed: the server
// withdraws the request, and a grant that crossed (a lease outlives the
// connection) is released by fence (releaseLate). Refused by the server,
// it holds and waits for nothing, and is kept for the next.
func (c *Client) asideFailed(ctx context.Context, ln *link, err error) {
	var se *ServerError
	switch {
	case c.isDraining(ln):
		// Close gave it up and drains it: it ends by itself.
	case ctx.Err() != nil:
		c.drainAside(ln, nil)
	case errors.As(err, &se) && !errors.Is(err, ErrConnectionLost):
		c.keepAside(ln)
	default:
		c.dropSide(ln)
	}
}

// isDraining: ln is a Lock's connection of its own being drained.
func (c *Client) isDraining(ln *link) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining[ln]
}

// drainAside half-closes a Lock's connection of its own whose request is
// given up (or the client's connection, as Close gives up what waits on
// it), reads on until the server has closed its side (or the drain
// limit), and releases by fence a grant that crossed (releaseLate); Close
// waits for both. fail (Close) is what a caller still waiting on it gets
// (see link.drain).
func (c *Client) drainAside(ln *link, fail error) {
	c.mu.Lock()
	delete(c.side, ln)
	c.draining[ln] = true
	c.mu.Unlock()
	ln.drain(func(keys []string, fence uint64) {
		// Counted before the link can end (this runs as it reads the
		// grant), so that Close, once the link has ended, waits for it.
		c.releases.Add(1)
		go func() {
			defer c.releases.Done()
			c.releaseLate(keys, fence)
		}()
	}, drainLimit, fail)
	go func() {
		<-ln.done
		c.mu.Lock()
		delete(c.draining, ln)
		c.mu.Unlock()
	}()
}

// releaseLate releases, by fence, a grant that reached a Lock's connection
// of its own given up meanwhile (a lease outlives it): on the client's
// connection, or, when that has ended (the Lock's connection outlives it;
// on a cluster, a session that is moving has not ended), on a connection
// opened for the Unlock, so the lease does not keep others out until it
// runs out. On failure (NotHeld: it ended or was released meanwhile) the
// lease runs out on its own. Called on a goroutine of its own; Close
// waits for it.
func (c *Client) releaseLate(keys []string, fence uint64) {
	body := &pb.RequestLock{Keys: keys, Fence: fence}
	if c.l.detached(pb.RequestType_Unlock, body) {
		return
	}
	_ = c.unlockOnNew(body)
}

// unlockOnNew sends one Unlock by fence on a connection (on a cluster, a
// session) opened for it and closed after, within the drain limit, and
// returns what the connect or the Unlock failed with.
func (c *Client) unlockOnNew(body *pb.RequestLock) error {
	ctx, cancel := context.WithTimeout(context.Background(), drainLimit)
	defer cancel()
	ln, err := openLink(ctx, c.d, 1, true)
	if err != nil {
		return err
	}
	defer ln.close("an unlock by fence sent")
	_, err = ln.call(ctx, pb.RequestType_Unlock, body, nil)
	return err
}

// unlockAgain sends again, by fence on a connection (on a cluster, a
// session) opened for it, the Unlock of a lock that may be a lease, which
// failed with lost because its connection (on a cluster, its session)
// ended before the answer came, perhaps before it was sent: a session that
// ends while it moves between nodes fails what it had queued, and a lease
// outlives the session. nil once that released the keys; the ErrNotHeld
// answer if they were not so held any more (the lease ran out, or the
// first Unlock was applied though its answer was lost); lost if no server
// could be reached, or the client was closed.
func (c *Client) unlockAgain(body *pb.RequestLock, lost error) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return lost
	}
	err := c.unlockOnNew(body)
	if err == nil || errors.Is(err, ErrNotHeld) {
		return err
	}
	return lost
}

// keepAside keeps a Lock's connection of its own that holds and waits for
// nothing for the next Lock, or closes it when enough are kept.
func (c *Client) keepAside(ln *link) {
	ln.mu.Lock()
	ln.onEnd = func(error, bool) {}
	ln.mu.Unlock()
	c.mu.Lock()
	keep := c.side[ln] && len(c.idle) < idleLockers && c.l.failure() == nil && ln.failure() == nil
	if keep {
		c.idle = append(c.idle, ln)
	} else {
		delete(c.side, ln)
	}
	c.mu.Unlock()
	if !keep {
		ln.close("not needed")
	}
}

// dropSide closes a connection of the client's own cleanly (on a cluster
// ending its session): what it holds without a lease is released, what it
// waits for withdrawn.
func (c *Client) dropSide(ln *link) {
	c.mu.Lock()
	delete(c.side, ln)
	c.mu.Unlock()
	ln.close("not needed")
}

func tryErr(err error, try bool) error {
	var se *ServerError
	if try && errors.As(err, &se) {
		se.try = true
	}
	return err
}

// granted is the Lock for a grant of keys under fence to a request sent at
// sent on ln: the client's connection (cl claims the keys there), or one
// of the lock's own (cl nil).
func (c *Client) granted(ctx context.Context, ln *link, cl *claim, keys []string, fence uint64, lease time.Duration, sent time.Time) (*Lock, error) {
	own := ln != c.l
	// The safety deadline counts from the Lock's send time, which after a
	// long wait may be about to pass when the grant arrives, although the
	// server started the lease only at the grant. The answer cannot prove
	// when that was, so a lease is renewed and a lock without one pinged,
	// which moves the deadline to now.
	now := time.Now()
	refresh := false
	if lease > 0 {
		refresh = now.Sub(sent) > lease/3
	} else {
		refresh = now.Sub(ln.freshness()) > ln.limits.SessionTimeout/4
	}
	if refresh {
		var err error
		if lease > 0 {
			_, err = ln.call(ctx, pb.RequestType_Renew, &pb.RequestLock{Keys: keys, Fence: fence, ReleaseMicro: toMicros(lease)}, nil)
			sent = now
		} else {
			_, err = ln.call(ctx, pb.RequestType_Ping, nil, nil)
		}
		if err != nil {
			// Nobody will hold this grant: release it.
			ln.detached(pb.RequestType_Unlock, &pb.RequestLock{Keys: keys, Fence: fence})
			cl.release()
			if own {
				c.dropSide(ln)
			}
			if errors.Is(err, ErrNotHeld) {
				return nil, &LostError{Reason: LostNotHeld, Keys: keys, Fence: fence, Err: err,
					Text: fmt.Sprintf("the lease of %v ran out before its grant could be renewed", lease)}
			}
			return nil, err
		}
	}
	l := &Lock{c: c, ln: ln, own: own, claim: cl, keys: keys, fence: fence, hold: granted(sent, wireLease(lease)),
		lost: make(chan struct{}), changed: make(chan struct{}), ended: make(chan struct{}),
		renewing: make(chan struct{}, 1)}
	c.mu.Lock()
	c.locks[l] = true
	c.mu.Unlock()
	if own {
		ln.mu.Lock()
		ln.onEnd = func(err error, closing bool) {
			if closing {
				l.setLost(LostClosed, "the client was closed", err)
			} else if l.Lease() == 0 {
				l.setLost(LostConnection, err.Error(), err)
			}
		}
		ln.mu.Unlock()
	}
	if err := ln.failure(); err != nil && lease == 0 {
		l.setLost(LostConnection, err.Error(), err)
	}
	go l.watchdog()
	return l, nil
}

func (c *Client) forget(l *Lock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.locks, l)
}

// unlocked disposes of a Lock's connection of its own after its Unlock
// answered err: it holds nothing after an answer, so it is kept for the
// next Lock; otherwise closed, which releases what it may still hold.
func (c *Client) unlocked(ln *link, err error) {
	if err == nil || errors.Is(err, ErrNotHeld) {
		c.keepAside(ln)
	} else {
		c.dropSide(ln)
	}
}

// Unlock releases keys held under fence, whichever connection took them:
// how a restarted process releases a lease it took earlier. ErrNotHeld
// (with the keys) if they are not so held.
func (c *Client) Unlock(ctx context.Context, keys []string, fence uint64) error {
	_, err := c.l.call(ctx, pb.RequestType_Unlock, &pb.RequestLock{Keys: keys, Fence: fence}, nil)
	return err
}

// Renew sets the lease of keys held under fence to now + lease.
// ErrNotHeld (with the keys) if they are not so held.
func (c *Client) Renew(ctx context.Context, keys []string, fence uint64, lease time.Duration) error {
	_, err := c.l.call(ctx, pb.RequestType_Renew, &pb.RequestLock{Keys: keys, Fence: fence, ReleaseMicro: toMicros(lease)}, nil)
	return err
}

// Proclaim replaces the value of keys held under fence (what Inspect and
// Watch show). ErrNotHeld if they are not so held.
func (c *Client) Proclaim(ctx context.Context, keys []string, fence uint64, value []byte) error {
	_, err := c.l.call(ctx, pb.RequestType_Proclaim, &pb.RequestLock{Keys: keys, Fence: fence, Value: value}, nil)
	return err
}

// Ping is a round trip to the server.
func (c *Client) Ping(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	_, err := c.l.call(ctx, pb.RequestType_Ping, nil, nil)
	return time.Since(start), err
}

// Inspect says who holds and who waits for each of keys, in order. It
// changes nothing.
func (c *Client) Inspect(ctx context.Context, keys []string) ([]KeyInfo, error) {
	if len(keys) == 0 {
		return nil, errors.New("dlock: Inspect needs at least one key; Stats describes the server")
	}
	resp, err := c.l.call(ctx, pb.RequestType_Inspect, &pb.RequestLock{Keys: keys}, nil)
	if err != nil {
		return nil, err
	}
	out := make([]KeyInfo, 0, len(resp.KeyInfo))
	for _, i := range resp.KeyInfo {
		out = append(out, keyInfoOf(i))
	}
	return out, nil
}

// Stats are the server's counts of connections, held keys and waiting requests.
func (c *Client) Stats(ctx context.Context) (ServerStats, error) {
	resp, err := c.l.call(ctx, pb.RequestType_Inspect, &pb.RequestLock{}, nil)
	if err != nil {
		return ServerStats{}, err
	}
	s := resp.GetServerStats()
	return ServerStats{Connections: s.GetConnections(), HeldKeys: s.GetHeldKeys(), WaitingRequests: s.GetWaitingRequests()}, nil
}

// Watch waits until the first holder of key (the one with the lowest
// fence, KeyInfo.First) is not the one named by knownFence and knownValue
// (0 and nil: the key is free), or until limit passes (0: 30 s, or half the
// session timeout if shorter), and returns the key as it is then: the
// server answers as soon as the change is applied (on a cluster,
// committed). Compare First with what you knew to tell a change from the
// limit.
//
// It runs on a connection of its own (kept for the next Watch), so it
// holds back no other call; if ctx ends, that connection is closed and the
// server forgets the Watch. ServerError WatchLimit when the server has its
// most Watches parked.
func (c *Client) Watch(ctx context.Context, key string, knownFence uint64, knownValue []byte, limit time.Duration) (KeyInfo, error) {
	if limit <= 0 {
		limit = 30 * time.Second
		if h := c.l.limits.SessionTimeout / 2; h < limit {
			limit = h
		}
	}
	body := &pb.RequestLock{Keys: []string{key}, Fence: knownFence, Value: knownValue, WaitMicro: toMicros(limit)}
	c.mu.Lock()
	var w *link
	if n := len(c.watchers); n > 0 {
		w, c.watchers = c.watchers[n-1], c.watchers[:n-1]
	}
	c.mu.Unlock()
	if w == nil {
		if err := c.Err(); err != nil {
			return KeyInfo{}, err
		}
		var err error
		if w, err = openLink(ctx, c.d, 1, true); err != nil {
			return KeyInfo{}, err
		}
		c.mu.Lock()
		c.side[w] = true
		c.mu.Unlock()
	}
	resp, err := w.call(ctx, pb.RequestType_Watch, body, nil)
	if err != nil && (ctx.Err() != nil || errors.Is(err, ErrConnectionLost)) {
		// Abandoned or broken: a clean close withdraws the parked Watch.
		c.mu.Lock()
		delete(c.side, w)
		c.mu.Unlock()
		w.close("watch abandoned")
		return KeyInfo{}, err
	}
	c.mu.Lock()
	if c.side[w] && len(c.watchers) < idleWatchers && c.Err() == nil {
		c.watchers = append(c.watchers, w)
		w = nil
	} else {
		delete(c.side, w)
	}
	c.mu.Unlock()
	if w != nil {
		w.close("not needed")
	}
	if err != nil {
		return KeyInfo{}, err
	}
	if len(resp.KeyInfo) == 0 {
		return KeyInfo{}, errors.New("dlock: Watch answered without key_info")
	}
	return keyInfoOf(resp.KeyInfo[0]), nil
}
