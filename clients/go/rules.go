package dlock

// The client's rules, as pure functions: what an answer proves, when a
// held lock must be given up, when a session moves to another node (a node
// gone silent included), what is numbered and sent again. Mirrors
// src/rules.rs of the Rust library, the one written form of the rules. No
// I/O and no clock of their own: the caller passes the times, so the link
// (link.go), the locks (lock.go) and the shared test vectors
// (clients/conformance/rules.json, run by rules_test.go) all ask the same
// code.

import (
	"math"
	"time"

	pb "dlock/clients/go/dlockpb"
)

// ClockRateBound is how much faster the server's clock may run than the
// client's, as a fraction of elapsed time. Clocks disciplined by NTP differ
// in rate by at most 500 ppm (the kernel's slew limit), free-running quartz
// by about 100 ppm; 0.1 % leaves room beyond both. Only rates matter: the
// clocks' values never meet.
const ClockRateBound = 0.001

// deadline is the latest moment a lock is still certainly held, for a
// window (a lease or a session timeout) that started at the server no
// earlier than sent: the window shortened by ClockRateBound of itself
// (rounded to the nanosecond, as Rust's Duration::mul_f64), in case the
// server's clock runs faster than the client's.
func deadline(sent time.Time, window time.Duration) time.Time {
	return sent.Add(window - time.Duration(math.Round(float64(window)*ClockRateBound)))
}

// margin is the safety margin in force for window: the configured one, at
// most a quarter of the window, so short windows still leave three
// quarters for renewing.
func margin(configured, window time.Duration) time.Duration {
	if q := window / 4; configured > q {
		return q
	}
	return configured
}

// inJeopardy says whether a lock whose deadline is dl is in jeopardy at
// now: its holder must stop, since only margin is left before the server
// may hand the lock on.
func inJeopardy(now, dl time.Time, margin time.Duration) bool {
	return !now.Add(margin).Before(dl)
}

// leaseFrom is a lease and when the request that set (or asked for) it
// was sent.
type leaseFrom struct {
	sent  time.Time
	lease time.Duration
}

// end is the deadline the lease gives.
func (f leaseFrom) end() time.Time { return deadline(f.sent, f.lease) }

// hold is what the client knows of how long one of its locks lasts at the
// server (src/rules.rs, Hold). Its pointers are never written through:
// copies of a hold are independent.
type hold struct {
	// lease: when the Lock, or the latest Renew answered, was sent, and the
	// lease it set. nil: the lock lives as long as its owner (the
	// connection, or on a cluster the session).
	lease *leaseFrom
	// unconfirmed is the renewal whose lease ends first among those sent
	// since the latest one was answered. The server may have applied any of
	// them though its answer never came, and applies them in the order
	// sent, so until the latest-sent renewal is answered the lock may end
	// with this one: a renewal to a shorter lease, or the first Renew of a
	// lock without a lease, which makes it a lease.
	unconfirmed *leaseFrom
	// latest is the renewal sent last: its answer supersedes every renewal
	// sent before it.
	latest *leaseFrom
}

// granted is the hold of a lock granted to a request sent at sent, with
// lease if it asked for one (0: none).
func granted(sent time.Time, lease time.Duration) hold {
	if lease <= 0 {
		return hold{}
	}
	return hold{lease: &leaseFrom{sent, lease}}
}

// deadline is the safety deadline, given the send time of the latest
// answer that proved the owner alive (ownerAcked) and the owner's timeout.
func (h hold) deadline(ownerAcked time.Time, ownerTimeout time.Duration) time.Time {
	held := deadline(ownerAcked, ownerTimeout)
	if h.lease != nil {
		held = h.lease.end()
	}
	if h.unconfirmed != nil {
		if u := h.unconfirmed.end(); u.Before(held) {
			held = u
		}
	}
	return held
}

// window is what the safety margin is taken from: the lease, or the
// owner's timeout, or an unconfirmed renewal's lease if shorter (a renewal
// to 2 s of a 60 s lease must leave time to renew, not a margin as long as
// the new lease).
func (h hold) window(ownerTimeout time.Duration) time.Duration {
	held := ownerTimeout
	if h.lease != nil {
		held = h.lease.lease
	}
	if h.unconfirmed != nil && h.unconfirmed.lease < held {
		return h.unconfirmed.lease
	}
	return held
}

// leaseLen is the lease known to be in force; 0 for none.
func (h hold) leaseLen() time.Duration {
	if h.lease != nil {
		return h.lease.lease
	}
	return 0
}

// renewSent: a Renew to lease was sent at sent. Once sent, the server may
// apply it though its answer never comes. Returns whether the hold
// changed.
func (h *hold) renewSent(sent time.Time, lease time.Duration) bool {
	r := leaseFrom{sent, lease}
	last := r
	h.latest = &last
	if h.unconfirmed != nil && !r.end().Before(h.unconfirmed.end()) {
		return false
	}
	h.unconfirmed = &r
	return true
}

// renewAnswered: the Renew to lease sent at sent was answered. The server
// replaces a lease's end with each Renew, in the order sent, so the
// latest-sent renewal answered is the one in force, even if it set a
// shorter lease. Only the answer to the renewal sent last supersedes every
// other: one sent later may still be applied after this one, and
// unconfirmed keeps only the soonest end of those in flight, so it stays
// (on the safe side) until that answer. Renewals are told apart by send
// time and lease, so of two sent at one instant the first's answer does
// not clear the second. Returns whether the hold changed.
func (h *hold) renewAnswered(sent time.Time, lease time.Duration) bool {
	newer := h.lease == nil || !h.lease.sent.After(sent)
	if newer {
		h.lease = &leaseFrom{sent, lease}
	}
	last := h.latest != nil && h.latest.sent.Equal(sent) && h.latest.lease == lease
	if last {
		h.unconfirmed = nil
		h.latest = nil
	}
	return newer || last
}

// movesDeadline says whether the answer status to a request of kind proves
// the owner was alive when the request was sent, and so moves the deadline
// of the locks bound to it. On a single server every answer does: the
// connection is the owner. On a session only an answer from a command that
// kept the session alive does: Ok to a Ping or to a Lock, Unlock, Renew or
// Enqueue; AcquireTimeout to a Lock or Enqueue; Queued to an Enqueue;
// NotHeld to an Unlock or Renew. A refusal (NotLeader from a deposed
// leader, Unavailable, ...), an Inspect or a Wait (read, not committed)
// proves nothing: counting it would keep a lock "held" here after the
// cluster gave it away.
func movesDeadline(onSession bool, kind pb.RequestType, status pb.ResponseStatus) bool {
	if !onSession {
		return true
	}
	switch status {
	case pb.ResponseStatus_Ok:
		switch kind {
		case pb.RequestType_Ping, pb.RequestType_Lock, pb.RequestType_Unlock, pb.RequestType_Renew, pb.RequestType_Enqueue:
			return true
		}
	case pb.ResponseStatus_AcquireTimeout:
		return kind == pb.RequestType_Lock || kind == pb.RequestType_Enqueue
	case pb.ResponseStatus_Queued:
		return kind == pb.RequestType_Enqueue
	case pb.ResponseStatus_NotHeld:
		return kind == pb.RequestType_Unlock || kind == pb.RequestType_Renew
	}
	return false
}

// disconnect is why a session leaves the node it is on (src/error.rs,
// Disconnect), as far as elsewhere tells.
type disconnect int

const (
	// stayHere: the answer was acted on at this node.
	stayHere disconnect = iota
	// sessionEnded: the cluster ended the session.
	sessionEnded
	// notLeader: the node does not lead; the leader it named, if any, goes
	// with it.
	notLeader
	// noQuorum: the node could not commit in time.
	noQuorum
)

// elsewhere says, on a session, whether the answer status means the
// request was not acted on at this node and the session must go on
// elsewhere (or has ended), and why; leader is the address a NotLeader
// named ("" none), returned with notLeader.
func elsewhere(status pb.ResponseStatus, leader string) (disconnect, string) {
	switch status {
	case pb.ResponseStatus_UnknownSession:
		// The cluster ended the session (its TTL ran out while the client
		// could not reach it): its locks may be another's now.
		return sessionEnded, ""
	case pb.ResponseStatus_NotLeader:
		// The node stopped leading and did not act: send the request (and
		// everything behind it) again to the new leader.
		return notLeader, leader
	case pb.ResponseStatus_Unavailable:
		// It could not commit in time: it may still be applied, so only a
		// resend under the same number is safe, after a fresh look for the
		// leader.
		return noQuorum, ""
	case pb.ResponseStatus_ShuttingDown:
		// The node is stopping (a rolling restart): the session goes on at
		// the next leader, where what is unanswered is sent again under its
		// number, so nothing is lost or done twice.
		return notLeader, ""
	}
	return stayHere, ""
}

// sessionUse says how a request of kind uses a session: whether it acts
// for the session's owner, and whether it is numbered with seq and so
// sent again after a reconnect under the same number. What changes the
// table is numbered; a Wait changes nothing (sent again after a failover,
// the new leader finds its ticket in the session) and an Inspect only
// reads.
func sessionUse(kind pb.RequestType) (actsForSession, numbered bool) {
	switch kind {
	case pb.RequestType_Lock, pb.RequestType_Unlock, pb.RequestType_Renew, pb.RequestType_Enqueue:
		return true, true
	case pb.RequestType_Inspect, pb.RequestType_Wait:
		return true, false
	}
	return false, false
}

// mayWait: requests whose answer may rightly take long: a Lock and a Wait
// wait for busy keys, a Watch for a change, up to its limit.
func mayWait(kind pb.RequestType) bool {
	return kind == pb.RequestType_Lock || kind == pb.RequestType_Wait || kind == pb.RequestType_Watch
}

// sessionLivesUntil is how long a session may be looked for after its
// stream broke at broke: it lives a TTL after the last command that kept
// it alive, the latest answered one (acked) or, while the stream was open,
// the node's own keep-alives, which the client does not see while a Lock
// waits. Past this no node knows it.
func sessionLivesUntil(acked, broke time.Time, ttl time.Duration) time.Time {
	if broke.After(acked) {
		acked = broke
	}
	return acked.Add(ttl)
}

// unansweredTooLong says whether the oldest unanswered request on a
// session, of kind and waiting for waited, shows a node that accepts but
// does not answer (a paused or stalled node, a path that drops without a
// reset): one that may not rightly wait, unanswered for half a TTL.
func unansweredTooLong(kind pb.RequestType, waited, ttl time.Duration) bool {
	return !mayWait(kind) && waited >= ttl/2
}

// renewal is when a keeper (KeepAlive) renews a lock of hold h, and to
// what lease: a third into the lease in force, to that lease again. false:
// a lock without a lease, even when an unanswered Renew may have made it
// one. That Renew's answer comes before any later one's (answers keep the
// order of requests), so a renewal sent behind it could prove nothing
// sooner, and renewing to the lease in force while a shorter renewal is
// unanswered would undo the shortening the owner asked for; until the
// answer comes, the deadline follows the unanswered renewal. The twin of
// Hold::renewal in src/rules.rs.
func (h hold) renewal() (time.Time, time.Duration, bool) {
	if h.lease == nil {
		return time.Time{}, 0, false
	}
	return h.lease.sent.Add(h.lease.lease / 3), h.lease.lease, true
}

const (
	// defaultElectionTimeout is assumed for a node that does not state one
	// (dlock-server's default).
	defaultElectionTimeout = 200 * time.Millisecond
	// minSilence is the shortest silence taken for a stall: a healthy node
	// on a loaded machine may take a few hundred milliseconds to answer a
	// Ping, and a false alarm costs a reconnect.
	minSilence = 1500 * time.Millisecond
	// silenceFloor is the shortest silence limit whatever the TTL: below
	// it a healthy node's scheduling delays would count as silence.
	silenceFloor = 250 * time.Millisecond
)

// silenceLimit is how long a node may leave a probe unanswered before it
// is taken for gone: three election timeouts (by then the others have
// replaced it if it led), at least minSilence, at most a quarter of the
// session's TTL (which wins: a short TTL must leave room to resume), so
// that finding a new leader and resuming there fit in what is left; but
// never below silenceFloor. As rules::silence_limit in src/rules.rs; the
// shared vectors (rules_test.go) hold them together.
func silenceLimit(election, ttl time.Duration) time.Duration {
	if election <= 0 {
		election = defaultElectionTimeout
	}
	// Saturating: the election timeout is the node's word.
	limit := time.Duration(math.MaxInt64)
	if election < limit/3 {
		limit = 3 * election
	}
	if limit < minSilence {
		limit = minSilence
	}
	if q := ttl / 4; limit > q {
		limit = q
	}
	// A node stating no TTL must not make the probe spin.
	if limit < silenceFloor {
		limit = silenceFloor
	}
	return limit
}

// goneSilent says whether a link that last heard from its node at
// lastHeard has gone silent at now for limit (silenceLimit): once the
// probe finds the node silent, such a link breaks off and resumes its
// session elsewhere; one that heard from the node within the limit stays
// (the probe's own connection was slow, not the node). The twin of
// rules::gone_silent in src/rules.rs: lastHeard + limit <= now. Times are
// durations from one origin; the link counts from zero (lastHeard 0, now
// the time since it heard), as src/link.rs does, so nothing it passes can
// overflow. Should a sum still pass the end of time, it saturates: that
// silence never comes.
func goneSilent(lastHeard, now, limit time.Duration) bool {
	end := lastHeard + limit
	if limit > 0 && end < lastHeard {
		return false
	}
	return end <= now
}
