package dlock

// Noticing that a cluster node has gone silent, even while every request
// on a link waits rightly (a Lock in line holds back the answers behind it,
// Pings included). Mirrors src/liveness.rs.
//
// A node that stalls instead of dying (SIGSTOP, a VM freeze, an fsync
// stall) or sits behind a path that drops packets without a reset keeps its
// sockets open and says nothing. The rest of the cluster replaces it as
// leader within 3 to 4 election timeouts, and from then on nobody keeps the
// client's session alive: it must resume on the new leader well within the
// session's TTL. The links' own answers cannot tell in time (they come in
// request order), so one probe per client and node pings on a connection of
// its own, with no session, which the node answers at once without a
// commit. When a Ping (or the probe's Hello) goes unanswered for
// silenceLimit, or a Ping is answered Unavailable (a node that counts
// itself leader with no majority behind it: cut off from its peers while
// clients still reach it, or stopping; docs/PROTOCOL.md, "Noticing a node
// that cannot serve"), links on that node break off and resume their
// sessions elsewhere (link.go, nodeSilent), and the node is tried last
// until it answers again. On a silence, a link that heard from the node
// within the limit stays (goneSilent: the probe's own connection was slow,
// not the node), but goes as soon as it too has heard nothing for the
// limit, unless the probe has been answered since (link.go, recheck); on
// Unavailable every link goes, since the node said it cannot serve. A
// node that refuses the probe outright (down, full, access denied) is
// left to the links, which see that themselves.

import (
	"bufio"
	"context"
	"fmt"
	"time"

	pb "dlock/clients/go/dlockpb"
)

const (
	// maxProbeRetry is the longest pause between probe attempts on a node
	// that refuses them.
	maxProbeRetry = 5 * time.Second
)

// nodeWatch is the probe of one node, shared by every link of a client on
// it; it stops when the last link lets go.
type nodeWatch struct {
	d     *dialer
	addr  string
	limit time.Duration
	stop  chan struct{}
	// links on the node, guarded by d.mu.
	links map[*link]bool
	// silences counts the reports of the node found silent, each once
	// every link on it was told (src/liveness.rs counts them too), guarded
	// by d.mu: what a test waits on.
	silences int
	// answered counts the probe's Hellos and Pings the node answered,
	// guarded by d.mu: a link that outlived a silence report learns from
	// it that the node answers again (link.go, recheck).
	answered uint64
}

// answers is how many of the probe's Hellos and Pings the node answered
// so far.
func (w *nodeWatch) answers() uint64 {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return w.answered
}

// answer counts one of the probe's Hellos or Pings answered.
func (w *nodeWatch) answer() {
	w.d.mu.Lock()
	w.answered++
	w.d.mu.Unlock()
}

// watchNode subscribes l to the probe of addr, starting one if no link of
// the client has one running.
func (d *dialer) watchNode(addr string, limit time.Duration, l *link) *nodeWatch {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.watches[addr]
	if w == nil {
		w = &nodeWatch{d: d, addr: addr, limit: limit, stop: make(chan struct{}), links: map[*link]bool{}}
		d.watches[addr] = w
		go w.run()
	}
	w.links[l] = true
	return w
}

// unsubscribe lets go of the probe; the last link stops it.
func (w *nodeWatch) unsubscribe(l *link) {
	d := w.d
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(w.links, l)
	if len(w.links) == 0 && d.watches[w.addr] == w {
		delete(d.watches, w.addr)
		close(w.stop)
	}
}

func (w *nodeWatch) run() {
	retry := w.limit / 2
	for {
		if why, cannotServe := w.untilSilent(); why != "" {
			w.d.suspect(w.addr, true)
			w.d.mu.Lock()
			links := make([]*link, 0, len(w.links))
			for l := range w.links {
				links = append(links, l)
			}
			// Nothing is answered until the next attempt: the count
			// stands for the moment of the report.
			answered := w.answered
			w.d.mu.Unlock()
			// Told outside d.mu: a link takes its own lock, then d.mu to
			// unsubscribe.
			for _, l := range links {
				l.nodeSilent(w.addr, why, cannotServe, answered)
			}
			w.d.mu.Lock()
			w.silences++
			w.d.mu.Unlock()
			retry = w.limit / 2
		} else if retry *= 2; retry > maxProbeRetry {
			retry = maxProbeRetry
		}
		t := time.NewTimer(retry)
		select {
		case <-w.stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// untilSilent pings the node on a connection of the probe's own, a third of
// the limit apart, until an answer is the limit late or says Unavailable:
// returns why the node counts as silent, and whether it answered
// Unavailable (it cannot serve) rather than nothing. "" when the node
// refuses otherwise or the connection breaks (not a silence) or the probe
// is stopped. Each answer that is not a refusal is counted (answered).
func (w *nodeWatch) untilSilent() (string, bool) {
	late := func(since time.Time) string {
		return fmt.Sprintf("%s did not answer its probe for %v", w.addr, time.Since(since).Round(time.Millisecond))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-w.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	started := time.Now()
	conn, err := w.d.connect(ctx, w.addr, started.Add(w.limit))
	if err != nil {
		if ctx.Err() == nil && time.Since(started) >= w.limit {
			return late(started), false
		}
		return "", false
	}
	// No session on it: a clean close ends nothing.
	defer conn.Close()
	go func() {
		<-ctx.Done()
		_ = conn.SetDeadline(time.Unix(1, 0))
	}()
	rd := bufio.NewReaderSize(conn, 4096)
	_ = conn.SetDeadline(started.Add(w.limit))
	resp, err := exchange(conn, rd, &pb.Request{Version: ProtocolVersion, Id: helloID, AccessToken: w.d.token, Type: pb.RequestType_Hello})
	if err != nil {
		if ctx.Err() == nil && isTimeout(err) {
			return late(started), false
		}
		return "", false
	}
	if resp.Status != pb.ResponseStatus_Ok && resp.Status != pb.ResponseStatus_InvalidType {
		return "", false
	}
	w.answer()
	w.d.suspect(w.addr, false)
	var id uint64
	for {
		t := time.NewTimer(w.limit / 3)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", false
		case <-t.C:
		}
		id++
		sent := time.Now()
		_ = conn.SetDeadline(sent.Add(w.limit))
		resp, err := exchange(conn, rd, &pb.Request{Version: ProtocolVersion, Id: id, AccessToken: w.d.token, Type: pb.RequestType_Ping})
		if err != nil {
			if ctx.Err() == nil && isTimeout(err) {
				return late(sent), false
			}
			return "", false
		}
		switch resp.Status {
		case pb.ResponseStatus_Ok:
			w.answer()
		case pb.ResponseStatus_Unavailable:
			// It answers but cannot serve: it counts itself leader with
			// no majority behind it (cut off from its peers, or
			// stopping). As good as silent for the sessions on it, and
			// sooner.
			return fmt.Sprintf("%s answered its probe Unavailable: it cannot serve (%s)", w.addr, resp.ErrorText), true
		default:
			return "", false
		}
	}
}

func isTimeout(err error) bool {
	type timeout interface{ Timeout() bool }
	for err != nil {
		if t, ok := err.(timeout); ok && t.Timeout() {
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}
