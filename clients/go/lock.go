package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "dlock/clients/go/dlockpb"
)

// Lock is keys held together under one fencing token, from Client.Lock.
//
// Every Lock has a safety deadline (Deadline): the latest moment it is
// certainly still held, judged from this side alone (docs/CLIENTS.md,
// "Sessions, pings and when a lock is lost"):
//
//   - a lease ends no sooner than the lease after the last answered Lock
//     or Renew was sent;
//   - a lock without a lease is released when the server ends the
//     connection (on a cluster: the session), which it may do once nothing
//     kept it alive for the session timeout; so the deadline is the send
//     time of the last request whose answer proves the owner alive, plus
//     the session timeout. On a single server any answer proves it; on a
//     cluster only the answer to a command the cluster committed for the
//     session (a deposed leader's NotLeader proves nothing);
//   - a Renew sent and not answered may have been applied all the same:
//     until an answer to a renewal sent no earlier comes, the deadline is
//     no later than that renewal's lease after it was sent (for a lock
//     without a lease too, which the Renew may have made a lease).
//
// All are shortened by ClockRateBound (rules.go holds these rules). Lost is
// closed a safety margin before the deadline unless an answer moved it on,
// and at once when the connection of a lock without a lease ends; Err then
// says why. Stop using the lock when Lost is closed, and pass Fence to the
// resource you protect, which should refuse a lower fence than it has
// seen: a paused process cannot notice in time that its lock was lost.
type Lock struct {
	c *Client
	// ln is the connection that holds it: the client's, or (own) one of
	// its own, taken for a wait and closed (or kept for the next) when the
	// lock is unlocked.
	ln  *link
	own bool
	// claim of its keys on the client's connection; nil when own.
	claim *claim
	keys  []string
	fence uint64

	mu sync.Mutex
	// hold is its lease, if any (none: bound to the connection, on a
	// cluster the session), and the renewal unanswered that may end it
	// sooner.
	hold     hold
	released bool
	err      error
	lost     chan struct{}
	// changed is closed, and replaced, when the hold moves or the lock
	// is released: it wakes every waiter (the watchdog, KeepAlive).
	changed chan struct{}
	// renewing orders renewals (a token of capacity 1): each is stamped
	// with its send time once the one before is answered, so the latest
	// stamp is the lease the server applied last.
	renewing chan struct{}
	// ended is closed when the lock is unlocked or lost.
	ended     chan struct{}
	endClosed bool
}

// changes is the channel closed at the next change; take it before
// reading what the change would move, or a change in between is missed.
func (l *Lock) changes() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// changedLocked wakes every waiter on changes; l.mu is held.
func (l *Lock) changedLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// endLocked closes ended, once; l.mu is held.
func (l *Lock) endLocked() {
	if !l.endClosed {
		l.endClosed = true
		close(l.ended)
	}
}

// Keys are the keys held, in the order locked.
func (l *Lock) Keys() []string { return append([]string(nil), l.keys...) }

// Fence is the grant's fencing token: pass it to the resource the lock
// protects, which should refuse writes with a lower token than it has seen.
func (l *Lock) Fence() uint64 { return l.fence }

// Lease is the lease length; 0 for a lock held without a lease.
func (l *Lock) Lease() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hold.leaseLen()
}

// Lost is closed when the lock can no longer be assumed held; Err says why.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err is nil while the lock is held (or once unlocked), then a *LostError
// saying why it was lost.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Deadline is the safety deadline: after it the server may hand the lock
// to someone else.
func (l *Lock) Deadline() time.Time {
	d, _ := l.deadline()
	return d
}

// deadline is the safety deadline and the margin before it at which the
// lock is in jeopardy.
func (l *Lock) deadline() (time.Time, time.Duration) {
	l.mu.Lock()
	h := l.hold
	l.mu.Unlock()
	timeout := l.ln.limits.SessionTimeout
	return h.deadline(l.ln.freshness(), timeout), margin(l.c.margin, h.window(timeout))
}

// Check returns Err, or a LostError if the lock is in jeopardy though the
// watchdog has not run yet: it reads the clock now (a paused or starved
// process runs its timers late).
func (l *Lock) Check() error {
	if err := l.Err(); err != nil {
		return err
	}
	if dl, m := l.deadline(); inJeopardy(time.Now(), dl, m) {
		l.setLost(LostDeadline, l.pastDeadline(), nil)
	}
	return l.Err()
}

func (l *Lock) pastDeadline() string {
	l.mu.Lock()
	h := l.hold
	l.mu.Unlock()
	t := l.ln.limits.SessionTimeout
	if u := h.unconfirmed; u != nil && !h.deadline(l.ln.freshness(), t).Before(u.end()) {
		return fmt.Sprintf("a renewal to a lease of %v got no answer in time, and the server may have applied it", u.lease)
	}
	if lease := h.leaseLen(); lease > 0 {
		return fmt.Sprintf("the lease of %v was not renewed in time", lease)
	}
	return fmt.Sprintf("no answer from the server proves the owner alive within the session timeout of %v; the server may end it and hand the lock on", t)
}

// watchdog reports the lock lost once it is in jeopardy (its deadline
// within the margin) unless an answer moved the deadline.
// Timers are re-armed lazily: answers move the deadline without touching
// the timer, which looks again when it fires.
func (l *Lock) watchdog() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if l.Err() != nil || l.isReleased() {
			return
		}
		changed := l.changes()
		dl, m := l.deadline()
		now := time.Now()
		if inJeopardy(now, dl, m) {
			l.setLost(LostDeadline, l.pastDeadline(), nil)
			return
		}
		wait := dl.Add(-m).Sub(now)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-changed:
		case <-l.lost:
			return
		}
	}
}

func (l *Lock) isReleased() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.released
}

// setLost reports the lock lost, once (not once released).
func (l *Lock) setLost(reason LostReason, text string, cause error) {
	l.mu.Lock()
	if l.err != nil || l.released {
		l.mu.Unlock()
		return
	}
	l.err = &LostError{Reason: reason, Keys: l.keys, Fence: l.fence, Text: text, Err: cause}
	close(l.lost)
	l.endLocked()
	l.mu.Unlock()
	l.c.forget(l)
	if reason == LostNotHeld {
		// The server said the keys are not held under this fence: nothing
		// of them is left to the client's connection. (Lost otherwise, a
		// lock may still be held there until its Unlock.)
		l.claim.release()
	}
}

// Unlock releases the keys, by fence (so a later grant to someone else is
// never touched). ErrNotHeld if they were no longer held (the lease ran
// out); ErrConnectionLost if the connection is gone (a lock without a
// lease is then released already). Unlock a lost Lock too: until then a
// Lock of its keys by this Client goes to a connection of its own.
//
// A lease outlives its connection (on a cluster, its session): if that
// ends before the Unlock is answered, perhaps before it was sent (a session
// that ends while it moves to a new leader), the Unlock is sent again by
// fence on a connection opened for it, within 10 s. Unlock returns nil if
// that released the keys; ErrNotHeld if they were not so held any more
// (the lease ran out, or the first Unlock was applied after all);
// ErrConnectionLost if no server could be reached (or the client was
// closed): the lease then runs until it ends.
func (l *Lock) Unlock(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	l.endLocked()
	l.changedLocked()
	mayBeLease := l.hold.lease != nil || l.hold.unconfirmed != nil || l.hold.latest != nil
	l.mu.Unlock()
	l.c.forget(l)
	body := &pb.RequestLock{Keys: l.keys, Fence: l.fence}
	// The keys are free for the client's connection once the Unlock is
	// queued: whatever is sent after it is acted on after it.
	_, queued, err := l.ln.callWith(ctx, pb.RequestType_Unlock, body, callOpts{queued: l.claim.release})
	if !queued {
		// No room before ctx ended: sent all the same, so the connection
		// does not keep the keys unseen.
		l.ln.detached(pb.RequestType_Unlock, body)
		l.claim.release()
	}
	if l.own {
		l.c.unlocked(l.ln, err)
	}
	if mayBeLease && errors.Is(err, ErrConnectionLost) {
		// A lease outlives the connection (session) that failed the
		// Unlock: sent again by fence elsewhere.
		return l.c.unlockAgain(body, err)
	}
	return err
}

// Renew sets the lease to now + lease. A lock taken without a lease
// becomes a lease: it then outlives the connection.
//
// It returns when the lock is lost at the latest: a renewal held up (a
// failover, a frozen path) never keeps its caller past the moment the lock
// must be given up; the error is then the *LostError. ErrNotHeld if the
// keys are no longer held.
func (l *Lock) Renew(ctx context.Context, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("dlock: Renew of %q needs a positive lease, not %v", l.keys, lease)
	}
	if err := l.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-l.lost:
			cancel()
		case <-ctx.Done():
		}
	}()
	select {
	case l.renewing <- struct{}{}:
		defer func() { <-l.renewing }()
	case <-ctx.Done():
		if lerr := l.Err(); lerr != nil {
			return lerr
		}
		return ctx.Err()
	}
	// As the server takes it: whole microseconds (toMicros).
	lease = wireLease(lease)
	sent := time.Now()
	// Once sent, the server may apply it though its answer never comes
	// (an error, a cancelled ctx): a lease ending sooner than the deadline
	// bounds it from now on, answered or not, also for a lock without a
	// lease, which the Renew may have made a lease. (Until answered it is
	// not taken for a lease: a lock without one is still reported lost
	// when its connection ends.)
	l.mu.Lock()
	if l.hold.renewSent(sent, lease) {
		l.changedLocked()
	}
	l.mu.Unlock()
	_, err := l.ln.call(ctx, pb.RequestType_Renew, &pb.RequestLock{Keys: l.keys, Fence: l.fence, ReleaseMicro: toMicros(lease)}, nil)
	if err != nil {
		if lerr := l.Err(); lerr != nil {
			return lerr
		}
		return err
	}
	l.mu.Lock()
	// The server replaces the lease end with each Renew, in the order sent,
	// so the latest-sent one answered is in force.
	if l.hold.renewAnswered(sent, lease) {
		l.changedLocked()
	}
	l.mu.Unlock()
	return nil
}

// KeepAlive renews a lease every third of it until ctx ends or the lock is
// lost, and returns why it stopped: the *LostError, or ctx's error. For a
// lock without a lease it only waits (the client's pings keep it); once a
// Renew of it is answered, it renews that lease. While a Renew is
// unanswered the lock's deadline follows it (hold.renewal says why no
// renewal is sent behind it). A renewal that gets no answer does not delay
// the verdict: the deadline is watched throughout. Run it beside the work:
//
//	go lock.KeepAlive(ctx)
//	select { case <-lock.Lost(): ...; case <-done: }
func (l *Lock) KeepAlive(ctx context.Context) error {
	for {
		if l.isReleased() {
			return nil
		}
		changed := l.changes()
		l.mu.Lock()
		at, lease, ok := l.hold.renewal()
		l.mu.Unlock()
		if !ok {
			select {
			case <-l.lost:
				return l.Err()
			case <-ctx.Done():
				return ctx.Err()
			case <-changed:
				// Renewed into a lease: keep it.
				continue
			}
		}
		t := time.NewTimer(time.Until(at))
		select {
		case <-l.lost:
			t.Stop()
			return l.Err()
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-changed:
			// Renewed meanwhile (perhaps to a shorter lease): reckon
			// the next renewal from that one.
			t.Stop()
			continue
		case <-t.C:
		}
		if l.isReleased() {
			return nil
		}
		err := l.Renew(ctx, lease)
		var se *ServerError
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, ErrLockLost):
			return err
		case errors.Is(err, ErrNotHeld):
			l.setLost(LostNotHeld, "the server no longer holds the lease (NotHeld on Renew)", err)
			return l.Err()
		case errors.As(err, &se):
			l.setLost(LostRenewRefused, "the server refused to renew the lease", err)
			return l.Err()
		default:
			// The connection is gone: the lease outlives it, and the
			// watchdog reports it lost when it could have run out.
			select {
			case <-l.lost:
				return l.Err()
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}
