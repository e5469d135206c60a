package dlock

// The connection under a Client: pipelined requests, answers matched in
// order, pings, and on a cluster the session that outlives each stream.
// Mirrors src/link.rs of the Rust library and connection.py of the Python
// client.
//
// Every request is framed and queued for a writer goroutine at once; the
// frames queued while it writes go out in its next write, so many
// goroutines' requests share one write under load. The server answers in
// order, so each answer belongs to the oldest unanswered request, and a
// reader goroutine hands it over; an answer out of order ends the stream.
// At most maxInFlight requests are unanswered at once, which bounds what
// is buffered here; further calls wait for a slot.
//
// Against a single server the link ends with its stream: every pending
// call fails, and so does every later one, since the server released the
// locks bound to the connection. Against a cluster the link names its
// session in every request that acts for an owner and numbers those that
// change the table (seq, seq_done). When the stream breaks, a node answers
// NotLeader, Unavailable or ShuttingDown (taken as NotLeader naming no
// leader), a request that should be answered at once is not, the node's
// probe finds it unable to serve, or finds it silent (liveness.go) while
// the stream too has heard nothing from it for the silence limit
// (goneSilent) or, having outlived that report, hears nothing for the
// limit before the probe is answered again (recheck), the
// stream is reset (never closed with a FIN, which would end the session),
// the leader is looked for, the session resumed there and the requests not
// answered are sent again, in order and under their first numbers.
//
// fresh is the send time of the last request whose answer proves the owner
// alive: the input of the client-side safety rule (lock.go). On a single
// server any answer does; on a cluster only answers from commands that kept
// the session alive (movesDeadline). The rules the link follows are the
// pure functions of rules.go.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	pb "dlock/clients/go/dlockpb"
)

type result struct {
	resp *pb.Response
	err  error
}

// pending is a request written (or, while the session moves, to be
// written) and not yet answered.
type pending struct {
	id   uint64
	kind pb.RequestType
	// sent is when it was (last) written: once it is answered, the server
	// had the owner alive no earlier than this.
	sent time.Time
	// reply gets the answer (buffered: never blocks); nil when nobody waits.
	reply chan result
	// answered: taken off the queue (answered, or failed with the link).
	answered bool
	// abandoned: the caller stopped waiting (its context ended).
	abandoned bool
	counted   bool
	// lockKeys of a Lock, Enqueue or Wait: a grant nobody collects is released.
	lockKeys []string
	// settled of a request given up (abandoned) is called once it holds
	// and waits for nothing of the link's owner any more (callOpts).
	settled func()
	// seq is its number in the session; 0 if it changes nothing or there is none.
	seq uint64
	// frame is the request as written, to send again after a reconnect; nil
	// against a single server, which never resumes.
	frame []byte
	// ticket a Wait collects.
	ticket uint64
}

// stream is one connection to one node, with its writer and reader.
type stream struct {
	conn net.Conn
	rd   *bufio.Reader
	addr string
	wake chan struct{}
	stop chan struct{}
	// final is written before a clean close (the client's Close).
	final []byte
	clean bool
	// heard is when the stream last read a frame from its node (at first,
	// when it was attached), guarded by the link's mu: a stream that heard
	// within the silence limit outlives the probe's report of a silence.
	heard time.Time
	// suspect is set, under the link's mu, while the stream has outlived
	// a report of its node's silence that the probe has not been answered
	// since: see nodeSilent.
	suspect *suspicion
}

// suspicion is what a stream that outlived a silence report keeps of it.
type suspicion struct {
	// why the probe found the node silent.
	why string
	// answered is the probe's count of answers (nodeWatch.answered) at the
	// report: once it moves, the node answers again.
	answered uint64
	// recheck fires when the stream will have heard nothing for the
	// silence limit (if it hears nothing more): recheck. Stopped when the
	// stream is detached.
	recheck *time.Timer
}

type link struct {
	d     *dialer
	quiet bool
	// forLock: a Lock's connection of its own (set before it is shared).
	forLock bool
	limits  Limits
	session uint64
	slots   chan struct{}
	// silenceLimit is how long the node's probe may go unanswered (on a
	// session): see liveness.go.
	silenceLimit time.Duration
	done         chan struct{}

	mu       sync.Mutex
	addr     string
	cur      *stream // nil while the session moves
	out      []byte
	pend     []*pending
	numbered []uint64
	// queued maps the ticket of each Enqueue answered Queued whose Wait has
	// not been answered to its number: seq_done stays below it, so that
	// after a failover the new leader still remembers an outcome decided
	// before it (docs/PROTOCOL.md, "Two-phase acquire").
	queued   map[uint64]uint64
	nextID   uint64
	nextSeq  uint64
	pingsOut int
	lastSend time.Time
	fresh    time.Time
	err      error
	watch    *nodeWatch
	// draining: a Lock's connection of its own given up, or the client's
	// closed (drain); late is told of a grant that still arrives, with mu
	// held: it must not block. A call made meanwhile fails with gone.
	draining bool
	late     func(keys []string, fence uint64)
	gone     error
	// onEnd is told once when the link ends (in a goroutine of its own).
	onEnd func(err error, closing bool)
}

// openLink connects (on a cluster: to the leader, with a new session) and
// starts the link's goroutines.
func openLink(ctx context.Context, d *dialer, maxInFlight int, quiet bool) (*link, error) {
	deadline := time.Now().Add(d.connectTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	est, err := d.establish(ctx, 0, deadline, false, "", "")
	if err != nil {
		return nil, err
	}
	if maxInFlight <= 0 {
		maxInFlight = 256
	}
	if p := int(est.limits.MaxPipeline); p > 0 && maxInFlight > p {
		// Past max_pipeline the server stops reading: more in flight only
		// buffers here.
		maxInFlight = p
	}
	l := &link{
		d:        d,
		quiet:    quiet,
		limits:   est.limits,
		session:  est.session,
		slots:    make(chan struct{}, maxInFlight),
		done:     make(chan struct{}),
		queued:   map[uint64]uint64{},
		nextSeq:  1,
		lastSend: est.ackedFrom,
		fresh:    est.ackedFrom,
		onEnd:    func(error, bool) {},
	}
	if l.session != 0 {
		l.silenceLimit = silenceLimit(est.limits.ElectionTimeout, est.limits.SessionTimeout)
	}
	l.mu.Lock()
	l.attachLocked(est)
	l.mu.Unlock()
	go l.tick()
	return l, nil
}

// attachLocked makes est the link's stream and starts its goroutines.
func (l *link) attachLocked(est *established) {
	s := &stream{conn: est.conn, rd: est.rd, addr: est.addr, wake: make(chan struct{}, 1), stop: make(chan struct{}), heard: time.Now()}
	l.cur = s
	l.addr = est.addr
	if l.session != 0 {
		l.watch = l.d.watchNode(est.addr, l.silenceLimit, l)
	}
	go l.writer(s)
	go l.reader(s)
	if len(l.out) > 0 {
		s.wake <- struct{}{}
	}
}

// detachLocked takes the stream away from the link: reset, or with clean
// closed after what is queued is written.
func (l *link) detachLocked(clean bool) {
	s := l.cur
	if s == nil {
		return
	}
	l.cur = nil
	if s.suspect != nil {
		// A recheck already under way finds the stream detached.
		s.suspect.recheck.Stop()
		s.suspect = nil
	}
	if l.watch != nil {
		l.watch.unsubscribe(l)
		l.watch = nil
	}
	if clean {
		s.clean = true
		s.final, l.out = l.out, nil
		// A write stuck on a node that stopped reading must not hold the
		// close up.
		_ = s.conn.SetWriteDeadline(time.Now().Add(time.Second))
	} else {
		l.out = nil // every frame in it is pending, and is sent again
		reset(s.conn)
	}
	close(s.stop)
}

func (l *link) writer(s *stream) {
	for {
		stopped := false
		select {
		case <-s.wake:
		case <-s.stop:
			stopped = true
		}
		l.mu.Lock()
		var buf []byte
		if l.cur == s {
			buf, l.out = l.out, nil
		} else if s.clean {
			buf, s.final = s.final, nil
			stopped = true
		} else {
			stopped = true
		}
		l.mu.Unlock()
		if len(buf) > 0 {
			if _, err := s.conn.Write(buf); err != nil {
				l.streamFailed(s, fmt.Sprintf("writing to %s failed", s.addr), err)
				stopped = true
			}
		}
		if !stopped && l.halfClose(s) {
			stopped = true
		}
		if stopped {
			if s.clean {
				// A clean close: on a cluster the node ends the session at once.
				_ = s.conn.Close()
			}
			return
		}
	}
}

func (l *link) reader(s *stream) {
	for {
		resp, err := readFrame(s.rd)
		if err != nil {
			l.streamFailed(s, fmt.Sprintf("reading from %s failed", s.addr), err)
			return
		}
		// Taken as the frame arrives, not once the link's lock is had.
		if !l.onResponse(s, resp, time.Now()) {
			return
		}
	}
}

// streamFailed: s is of no more use (if it is still the link's).
func (l *link) streamFailed(s *stream, reason string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != s || l.err != nil {
		return
	}
	l.failLocked(reason, err, "", "")
}

// failLocked moves the session to the leader (prefer: a leader a node
// named; avoid: a node found silent), or without a session ends the link.
func (l *link) failLocked(reason string, err error, prefer, avoid string) {
	if l.session == 0 || l.draining {
		l.endLocked(&ConnectionLostError{Reason: reason, Err: err}, false)
		return
	}
	from := l.addr
	l.detachLocked(false)
	if err != nil {
		reason = fmt.Sprintf("%s: %v", reason, err)
	}
	if !l.quiet {
		go l.d.event(Event{Kind: Reconnecting, Addr: from, Session: l.session, Reason: reason})
	}
	go l.resume(reason, prefer, avoid)
}

func (l *link) resume(reason, prefer, avoid string) {
	l.mu.Lock()
	broke := time.Now()
	// Past this no node knows the session. (Locks enforce the safety
	// deadline apart.)
	deadline := sessionLivesUntil(l.fresh, broke, l.limits.SessionTimeout)
	l.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	est, err := l.d.establish(ctx, l.session, deadline, true, prefer, avoid)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		if est != nil {
			reset(est.conn)
		}
		return
	}
	if err != nil {
		var lost *ConnectionLostError
		if !asLost(err, &lost) {
			lost = &ConnectionLostError{Reason: fmt.Sprintf("session %d not resumed after %s", l.session, reason), Err: err}
		}
		l.endLocked(lost, false)
		return
	}
	if est.ackedFrom.After(l.fresh) {
		l.fresh = est.ackedFrom
	}
	// Everything not answered, first, in order, under its first number:
	// its answer will come from this stream.
	now := time.Now()
	var resend []byte
	for _, p := range l.pend {
		if p.frame != nil {
			resend = append(resend, p.frame...)
			p.sent = now
		}
	}
	l.out = append(resend, l.out...)
	l.attachLocked(est)
	if !l.quiet {
		go l.d.event(Event{Kind: Resumed, Addr: est.addr, Session: l.session, After: now.Sub(broke)})
	}
}

func asLost(err error, target **ConnectionLostError) bool {
	e, ok := err.(*ConnectionLostError)
	if ok {
		*target = e
	}
	return ok
}

// nodeSilent: the probe found addr silent, or unable to serve
// (cannotServe; why says how); answered is its count of answers from the
// node at the report (nodeWatch.answered). Unable to serve: leave it,
// whatever the stream heard (the node said so itself). Silent: leave it if
// the stream too has heard nothing from it for the silence limit. A stream
// that heard within the limit stays: the probe's own connection was slow
// (a new leader flooded with resumes), not the node, and breaking off
// would feed the storm (src/link.rs, Driver::run). But the node is
// suspect: the stream checks again when it will have heard nothing for the
// limit (recheck), at most a limit after this report, rather than wait
// for the probe's next one, which comes only after its retry pause (half a
// limit) and a whole limit more.
func (l *link) nodeSilent(addr, why string, cannotServe bool, answered uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || l.cur == nil || l.addr != addr {
		return
	}
	if cannotServe {
		l.failLocked(why, nil, "", addr)
		return
	}
	s := l.cur
	// Counted from zero: a time plus a limit the node sized could
	// overflow, a duration since cannot.
	quiet := time.Since(s.heard)
	if goneSilent(0, quiet, l.silenceLimit) {
		l.silentLocked(why, quiet)
		return
	}
	// A later report while suspect starts the suspicion over from it.
	if s.suspect == nil {
		s.suspect = &suspicion{recheck: time.AfterFunc(l.silenceLimit-quiet, func() { l.recheck(s) })}
	} else {
		s.suspect.recheck.Reset(l.silenceLimit - quiet)
	}
	s.suspect.why, s.suspect.answered = why, answered
}

// recheck: s, which outlived a report of its node's silence, would by now
// have heard nothing for the silence limit if it heard nothing since. If
// the probe was answered since the report, the node answers again: no
// longer suspect. Otherwise, if s has heard nothing for the limit, it
// breaks off as on the report; if it heard meanwhile, it checks again a
// limit after that.
func (l *link) recheck(s *stream) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || l.cur != s || s.suspect == nil || l.watch == nil {
		return
	}
	if l.watch.answers() != s.suspect.answered {
		s.suspect = nil
		return
	}
	quiet := time.Since(s.heard)
	if goneSilent(0, quiet, l.silenceLimit) {
		l.silentLocked(s.suspect.why, quiet)
		return
	}
	// Never 0: goneSilent says no only while quiet is under the limit.
	s.suspect.recheck.Reset(l.silenceLimit - quiet)
}

// silentLocked breaks off from the node the probe found silent (why), on
// which the stream too heard nothing for quiet.
func (l *link) silentLocked(why string, quiet time.Duration) {
	l.failLocked(fmt.Sprintf("%s; this connection heard nothing from it for %v", why, quiet.Round(time.Millisecond)), nil, "", l.addr)
}

// onResponse takes one answer, read from s at heard, off the queue; false
// ends the reader.
func (l *link) onResponse(s *stream, resp *pb.Response, heard time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != s || l.err != nil {
		return false
	}
	// Any frame counts, even one that sends the session elsewhere: the
	// node is not silent.
	s.heard = heard
	if len(l.pend) == 0 || l.pend[0].id != resp.RequestId {
		// An answer to nothing: the server turned the connection away
		// (request_id 0: too many connections, frame too large) or broke
		// ordering.
		reason := fmt.Sprintf("%s answered request %d, which was not the next one due", s.addr, resp.RequestId)
		var err error
		if resp.RequestId == 0 && resp.Status != pb.ResponseStatus_Ok {
			err = errorOf(pb.RequestType_Invalid, resp)
			reason = fmt.Sprintf("%s turned the connection away", s.addr)
		}
		l.failLocked(reason, err, "", "")
		return false
	}
	if l.session != 0 {
		// Answers that send the session elsewhere leave the request in
		// place, to be sent again there.
		switch why, leader := elsewhere(resp.Status, resp.LeaderAddr); why {
		case sessionEnded:
			l.endLocked(&ConnectionLostError{
				Reason: fmt.Sprintf("session %d has ended (%s): its locks without a lease may be another's", l.session, resp.ErrorText),
				Err:    errorOf(l.pend[0].kind, resp),
			}, false)
			return false
		case notLeader:
			if resp.Status == pb.ResponseStatus_ShuttingDown {
				// The node is stopping (a rolling restart) and did
				// nothing: as NotLeader naming no leader, and the node
				// is tried last. The caller never sees it.
				l.failLocked(fmt.Sprintf("%s is shutting down", s.addr), nil, "", s.addr)
			} else {
				l.failLocked(fmt.Sprintf("%s stopped leading", s.addr), nil, leader, "")
			}
			return false
		case noQuorum:
			l.failLocked(fmt.Sprintf("%s could not commit in time (Unavailable)", s.addr), nil, "", "")
			return false
		}
	}
	p := l.pend[0]
	l.pend[0] = nil
	l.pend = l.pend[1:]
	p.answered = true
	if p.seq != 0 && len(l.numbered) > 0 {
		l.numbered = l.numbered[1:]
	}
	if p.kind == pb.RequestType_Enqueue && resp.Status == pb.ResponseStatus_Queued && p.seq != 0 {
		l.queued[resp.Ticket] = p.seq
	} else if p.kind == pb.RequestType_Wait {
		delete(l.queued, p.ticket)
	}
	if p.counted {
		<-l.slots
	}
	if movesDeadline(l.limits.ResumableSessions, p.kind, resp.Status) {
		if p.sent.After(l.fresh) {
			l.fresh = p.sent
		}
	}
	if p.kind == pb.RequestType_Ping && p.reply == nil {
		l.pingsOut--
	}
	switch {
	case p.abandoned:
		if p.lockKeys != nil && resp.Status == pb.ResponseStatus_Ok && l.draining {
			// The grant crossed the half-close: released elsewhere.
			if l.late != nil {
				l.late(p.lockKeys, resp.Fence)
			}
		} else if p.lockKeys != nil && resp.Status == pb.ResponseStatus_Ok {
			// The caller stopped waiting: release what it was granted.
			_ = l.sendLocked(pb.RequestType_Unlock, &pb.RequestLock{Keys: p.lockKeys, Fence: resp.Fence}, &pending{})
		}
		// An Enqueue answered Queued still waits in line, and nobody
		// will collect it: its keys stay the owner's (until the link ends).
		if p.settled != nil && !(p.kind == pb.RequestType_Enqueue && resp.Status == pb.ResponseStatus_Queued) {
			// On a goroutine of its own: it takes the client's lock, which
			// is never taken inside the link's. The release queued above
			// goes before anything sent after it.
			go p.settled()
		}
	case p.reply != nil:
		p.reply <- result{resp: resp}
	}
	return true
}

// endLocked ends the link once: fails what is pending, then tells onEnd.
// clean: the client closes it with a FIN (a cluster node ends the session
// at once and releases its locks); otherwise it is reset.
func (l *link) endLocked(err error, clean bool) {
	if l.err != nil {
		return
	}
	l.err = err
	l.detachLocked(clean)
	close(l.done)
	pend := l.pend
	l.pend, l.numbered = nil, nil
	for _, p := range pend {
		p.answered = true
		if p.counted {
			<-l.slots
		}
		if p.reply != nil && !p.abandoned {
			p.reply <- result{err: err}
		}
		if p.abandoned && p.settled != nil {
			go p.settled()
		}
	}
	go l.onEnd(err, clean)
}

// drain gives up a Lock's connection of its own whose Lock waits, or the
// client's connection as the client is closed: once what is queued is
// written, the connection is half-closed. The server then withdraws the
// request (on a cluster, ends the session) and closes its side; a grant it
// sent before is still read, and late is told of it (the connection cannot
// release it any more: a lease outlives it), before the link ends and with
// its lock held, so late must not block. After bound the connection is
// closed whatever happened.
//
// fail, when not nil (the client is closed), is the error every caller
// still waiting on the link gets at once, as a closed link would give it,
// and a call made later too; if no Lock, Enqueue or Wait waits, nothing
// can cross and the link is closed with fail instead.
func (l *link) drain(late func(keys []string, fence uint64), bound time.Duration, fail error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || l.draining {
		return
	}
	gone := fail
	if gone == nil {
		gone = &ConnectionLostError{Reason: "withdrawn"}
	}
	if fail != nil {
		waiting := false
		for _, p := range l.pend {
			if p.reply != nil && !p.answered && !p.abandoned {
				// Its answer, a grant too, now goes to late.
				p.abandoned = true
				p.reply <- result{err: fail}
				waiting = waiting || p.lockKeys != nil
			}
		}
		if !waiting {
			l.endLocked(fail, true)
			return
		}
	}
	l.draining, l.late, l.gone = true, late, gone
	if l.cur == nil {
		// The session is moving: end it cleanly instead.
		l.endLocked(gone, true)
		return
	}
	select {
	case l.cur.wake <- struct{}{}:
	default:
	}
	time.AfterFunc(bound, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.endLocked(gone, true)
	})
}

// halfClose closes s's writing side when the link drains and nothing is
// left to write; true if s is done with writing.
func (l *link) halfClose(s *stream) bool {
	l.mu.Lock()
	half := l.draining && l.cur == s && len(l.out) == 0
	l.mu.Unlock()
	if !half {
		return false
	}
	cw, ok := s.conn.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		l.streamFailed(s, "withdrawn", nil)
	}
	return true
}

// close ends the link cleanly: what is queued is still sent.
func (l *link) close(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLocked(&ConnectionLostError{Reason: reason}, true)
}

// sendLocked queues one request; its answer goes to p.reply.
func (l *link) sendLocked(kind pb.RequestType, body *pb.RequestLock, p *pending) error {
	req := &pb.Request{Version: ProtocolVersion, Id: l.nextID + 1, AccessToken: l.d.token, Type: kind, Lock: body}
	var seq uint64
	actsForSession, isNumbered := sessionUse(kind)
	if l.session != 0 {
		switch {
		case isNumbered:
			seq = l.nextSeq
			req.Session = l.session
			req.Seq = seq
			below := seq
			if len(l.numbered) > 0 {
				below = l.numbered[0]
			}
			for _, s := range l.queued {
				if s < below {
					below = s
				}
			}
			req.SeqDone = below - 1
		case actsForSession && (kind == pb.RequestType_Wait || len(body.GetKeys()) > 0):
			// An Inspect without keys asks for server counts, no owner's.
			req.Session = l.session
		}
	}
	frame, err := encodeFrame(nil, req)
	if err != nil {
		return fmt.Errorf("dlock: cannot encode %s: %w", kind, err)
	}
	if max := l.limits.MaxFrame; max > 0 && len(frame)-4 > int(max) {
		// The server would answer FrameTooLarge and close the connection,
		// taking every lock on it along: refuse here instead.
		return &ServerError{Request: kind, Status: pb.ResponseStatus_FrameTooLarge,
			Text: fmt.Sprintf("request of %d bytes is over the server's max_frame of %d (not sent)", len(frame)-4, max)}
	}
	l.nextID++
	if seq != 0 {
		l.nextSeq++
		l.numbered = append(l.numbered, seq)
	}
	now := time.Now()
	p.id, p.kind, p.sent, p.seq = req.Id, kind, now, seq
	if kind == pb.RequestType_Wait {
		p.ticket = body.GetTicket()
	}
	if l.session != 0 {
		p.frame = frame
	}
	l.pend = append(l.pend, p)
	if !l.limits.ResumableSessions || kind == pb.RequestType_Ping || isNumbered {
		// On a cluster an Inspect keeps nothing alive that the client could
		// prove: a Ping is still due.
		l.lastSend = now
	}
	if l.cur == nil {
		return nil // the session is moving: sent with the rest once resumed
	}
	l.out = append(l.out, frame...)
	select {
	case l.cur.wake <- struct{}{}:
	default:
	}
	return nil
}

// call sends one request and waits for its answer; a refusal is an error
// (and the answer is returned too). If ctx ends first, the call returns
// ctx's error at once and a grant that arrives later for lockKeys is
// released.
func (l *link) call(ctx context.Context, kind pb.RequestType, body *pb.RequestLock, lockKeys []string) (*pb.Response, error) {
	resp, _, err := l.callWith(ctx, kind, body, callOpts{lockKeys: lockKeys})
	return resp, err
}

// callOpts are what a call that claims keys (client.go) needs to know.
type callOpts struct {
	// lockKeys of a Lock, Enqueue or Wait: a grant nobody collects is
	// released.
	lockKeys []string
	// queued is called as soon as the request is queued, before its
	// answer: whatever is sent later is acted on after it.
	queued func()
	// settled is called once, unless the answer is a success, when the
	// request queued holds and waits for nothing of the link's owner:
	// refused, failed with the link, or given up (ctx) and then refused,
	// its late grant's release queued, or the link ended. (An Enqueue
	// given up and answered Queued never settles.)
	settled func()
}

// callWith is call with callOpts; queued says whether the request was
// queued at all (when it was not, neither of the callbacks is called).
func (l *link) callWith(ctx context.Context, kind pb.RequestType, body *pb.RequestLock, o callOpts) (*pb.Response, bool, error) {
	select {
	case <-l.done:
		return nil, false, l.failure()
	default:
	}
	select {
	case l.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	case <-l.done:
		return nil, false, l.failure()
	}
	p := &pending{reply: make(chan result, 1), counted: true, lockKeys: o.lockKeys, settled: o.settled}
	l.mu.Lock()
	if l.err != nil || l.draining {
		err := l.err
		if err == nil {
			err = l.gone
		}
		l.mu.Unlock()
		<-l.slots
		return nil, false, err
	}
	if err := l.sendLocked(kind, body, p); err != nil {
		l.mu.Unlock()
		<-l.slots
		return nil, false, err
	}
	l.mu.Unlock()
	if o.queued != nil {
		o.queued()
	}
	settle := func() {
		if o.settled != nil {
			o.settled()
		}
	}
	var r result
	select {
	case r = <-p.reply:
	case <-ctx.Done():
		l.mu.Lock()
		if !p.answered {
			// The answer (or the link's end) settles it.
			p.abandoned = true
			l.mu.Unlock()
			return nil, true, ctx.Err()
		}
		l.mu.Unlock()
		r = <-p.reply
		if r.err == nil && o.lockKeys != nil && r.resp.Status == pb.ResponseStatus_Ok {
			l.detached(pb.RequestType_Unlock, &pb.RequestLock{Keys: o.lockKeys, Fence: r.resp.Fence})
		}
		if r.err != nil || r.resp.Status != pb.ResponseStatus_Queued || kind != pb.RequestType_Enqueue {
			settle()
		}
		return nil, true, ctx.Err()
	}
	if r.err != nil {
		settle()
		return nil, true, r.err
	}
	err := errorOf(kind, r.resp)
	if err != nil {
		settle()
	}
	return r.resp, true, err
}

// detached sends a request whose answer nobody reads (best effort); false
// if the link has ended or drains, and sends nothing. (On a cluster, while
// the session moves, the request is queued and sent once it is resumed.)
func (l *link) detached(kind pb.RequestType, body *pb.RequestLock) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || l.draining {
		return false
	}
	_ = l.sendLocked(kind, body, &pending{})
	return true
}

func (l *link) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// freshness is the send time of the last request whose answer proves the
// owner alive.
func (l *link) freshness() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fresh
}

// tick sends a Ping whenever nothing was sent for a quarter of the session
// timeout, and on a session leaves a node that leaves a request that
// should be answered at once unanswered too long (unansweredTooLong: half
// the TTL, as src/link.rs). The probe, liveness.go, usually notices a
// silent node first, within a quarter of the TTL.
func (l *link) tick() {
	ttl := l.limits.SessionTimeout
	interval := ttl / 4
	if interval < 10*time.Millisecond {
		interval = 10 * time.Millisecond
	}
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		l.mu.Lock()
		if l.err != nil {
			l.mu.Unlock()
			return
		}
		now := time.Now()
		wake := now.Add(interval)
		if l.cur != nil {
			wake = l.lastSend.Add(interval)
			if l.session != 0 && len(l.pend) > 0 {
				head := l.pend[0]
				if waited := now.Sub(head.sent); unansweredTooLong(head.kind, waited, ttl) {
					l.failLocked(fmt.Sprintf("no answer from %s for %v", l.addr, waited.Round(time.Millisecond)), nil, "", l.addr)
					l.mu.Unlock()
					continue
				}
				// Half a TTL after it was sent, unansweredTooLong says yes
				// to a request that may not wait.
				if h := head.sent.Add(ttl / 2); !mayWait(head.kind) && h.Before(wake) {
					wake = h
				}
			}
			if !now.Before(wake) {
				// Pings behind a waiting Lock are read (they keep the owner
				// alive) but not answered until the Lock is; past
				// max_pipeline unanswered requests the server stops reading.
				if l.draining {
					l.lastSend = now
				} else if l.pingsOut < int(l.limits.MaxPipeline) || l.limits.MaxPipeline == 0 && l.pingsOut < 1024 {
					l.pingsOut++
					_ = l.sendLocked(pb.RequestType_Ping, nil, &pending{})
				} else {
					l.lastSend = now
				}
				wake = now.Add(interval)
			}
		}
		l.mu.Unlock()
		timer.Reset(time.Until(wake))
		select {
		case <-timer.C:
		case <-l.done:
			return
		}
	}
}
