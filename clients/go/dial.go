package dlock

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "dlock/clients/go/dlockpb"

	"google.golang.org/protobuf/proto"
)

// ProtocolVersion is the version every request carries.
const ProtocolVersion = 2

// DefaultServer is dlock-server's default listen address.
const DefaultServer = "127.0.0.1:7436"

// maxAnswer bounds an answer frame: a length over it is refused instead of
// allocated (as the Rust and Python clients do, 4 MiB).
const maxAnswer = 4 << 20

// Ids of the handshake's requests: above the ids of calls, which count up
// from 1, so an answer can never be taken for another's.
const (
	helloID       = ^uint64(0)
	openSessionID = ^uint64(0) - 1
)

const (
	// minAttempt is the shortest time one node gets to answer when there
	// are several.
	minAttempt = 500 * time.Millisecond
	// firstPause and maxPause bound the pause between rounds of the nodes:
	// an election takes a few hundred milliseconds at best, and every pause
	// adds to the failover.
	firstPause = 20 * time.Millisecond
	maxPause   = 250 * time.Millisecond
)

// Servers parses where to connect: one HOST:PORT, or a cluster's nodes as
// a comma-separated list. Empty: DLOCK_SERVER, else DefaultServer. It
// refuses an entry that is not HOST:PORT, naming it.
func Servers(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		list = os.Getenv("DLOCK_SERVER")
		if strings.TrimSpace(list) == "" {
			list = DefaultServer
		}
	}
	var addrs []string
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		host, port, err := net.SplitHostPort(item)
		n, perr := strconv.Atoi(port)
		if err != nil || host == "" || perr != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("dlock: server %q is not HOST:PORT", item)
		}
		addrs = append(addrs, item)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("dlock: server list %q names no address", list)
	}
	return addrs, nil
}

// TLSFromEnv is the TLS configuration DLOCK_TLS_CA, DLOCK_TLS_CERT and
// DLOCK_TLS_KEY describe, as the dlock command and the other clients read
// them: nil (plain TCP) when DLOCK_TLS_CA is unset.
func TLSFromEnv() (*tls.Config, error) {
	return TLSConfig(os.Getenv("DLOCK_TLS_CA"), os.Getenv("DLOCK_TLS_CERT"), os.Getenv("DLOCK_TLS_KEY"))
}

// TLSConfig trusts the CA in the PEM file ca (the server's certificate
// must name the host dialled) and, with cert and key, presents that
// certificate to a server that asks for one (mutual TLS). TLS 1.2 at
// least. All empty: nil, plain TCP.
func TLSConfig(ca, cert, key string) (*tls.Config, error) {
	if (cert == "") != (key == "") {
		return nil, errors.New("dlock: a TLS client certificate and its key go together (DLOCK_TLS_CERT, DLOCK_TLS_KEY)")
	}
	if ca == "" {
		if cert != "" {
			return nil, errors.New("dlock: a TLS client certificate needs a CA to verify the server with (DLOCK_TLS_CA)")
		}
		return nil, nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("dlock: TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("dlock: TLS CA %s holds no PEM certificate", ca)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("dlock: TLS client certificate %s: %w", cert, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// dialer is what every connect and reconnect of a client needs: where,
// how, and whom to tell. It holds no connection.
type dialer struct {
	addrs          []string
	token          string
	tls            *tls.Config
	connectTimeout time.Duration
	sessionTTL     time.Duration
	onEvent        func(Event)

	mu sync.Mutex
	// leader is the node that last opened or resumed a session: tried
	// first, since it was the leader.
	leader string
	// suspects are nodes a probe found silent that have not answered
	// since: tried last (liveness.go).
	suspects map[string]bool
	watches  map[string]*nodeWatch
}

func (d *dialer) event(e Event) {
	if d.onEvent != nil {
		d.onEvent(e)
	}
}

func (d *dialer) getLeader() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.leader
}

func (d *dialer) setLeader(addr string) {
	d.mu.Lock()
	d.leader = addr
	d.mu.Unlock()
}

// forgetLeader stops trying addr first: it did not answer.
func (d *dialer) forgetLeader(addr string) {
	d.mu.Lock()
	if d.leader == addr {
		d.leader = ""
	}
	d.mu.Unlock()
}

// suspect marks addr as found silent (tried last, and no longer first as
// the leader), or as answering again.
func (d *dialer) suspect(addr string, silent bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if silent {
		d.suspects[addr] = true
		if d.leader == addr {
			d.leader = ""
		}
	} else {
		delete(d.suspects, addr)
	}
}

func (d *dialer) isSuspect(addr string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.suspects[addr]
}

// established is a stream to a node, ready for a link.
type established struct {
	conn   net.Conn
	rd     *bufio.Reader
	addr   string
	limits Limits
	// session opened or resumed; 0 on a single server.
	session uint64
	// ackedFrom is when the last request of the handshake was sent: the
	// server (and the session) was alive no earlier.
	ackedFrom time.Time
}

// nodeError is why one node did not serve.
type nodeError struct {
	err      error
	notLead  bool
	leader   string
	gone     bool // the cluster no longer knows the session
	fatal    bool // no use trying any other node: access denied, a bad answer
	stopping bool // answered ShuttingDown
	answered bool
}

// establish connects to a node among d's servers before deadline: on a
// cluster the leader, opening a session (session 0) or resuming session.
// Tried in order: prefer (a leader some node named), the last known
// leader, the servers in order, suspects last; each leader a node names
// right after that node. avoid (a node just found silent) comes last and
// only with at most minAttempt, in a round where no other node answered
// or the others name it leader: a paused node would otherwise take its
// whole share of the time every round while the others elect a leader.
//
// persist: keep going round the servers until the deadline (a session to
// resume). Otherwise (a new client) stop after a round in which no node
// answered at all, so that a dead server is reported at once.
func (d *dialer) establish(ctx context.Context, session uint64, deadline time.Time, persist bool, prefer, avoid string) (*established, error) {
	var attempts []Attempt
	pause := firstPause
	n := len(d.addrs)
	perNode := d.connectTimeout
	if n > 1 {
		perNode = d.connectTimeout / time.Duration(n)
		if perNode < minAttempt {
			perNode = minAttempt
		}
	}
	for {
		var queue, quiet []string
		seen := map[string]bool{}
		add := func(a string) {
			if a != "" && a != avoid && !seen[a] {
				seen[a] = true
				if d.isSuspect(a) {
					quiet = append(quiet, a)
				} else {
					queue = append(queue, a)
				}
			}
		}
		add(prefer)
		add(d.getLeader())
		for _, a := range d.addrs {
			add(a)
		}
		queue = append(queue, quiet...)
		tried := map[string]bool{}
		answered, namedAvoided := false, false
		for len(queue) > 0 || (avoid != "" && (namedAvoided || !answered) && !tried[avoid]) {
			var addr string
			if len(queue) > 0 {
				addr, queue = queue[0], queue[1:]
			} else {
				addr = avoid
			}
			if tried[addr] {
				continue
			}
			tried[addr] = true
			now := time.Now()
			if !now.Before(deadline) && len(attempts) > 0 {
				break
			}
			share := perNode
			if addr == avoid && share > minAttempt {
				share = minAttempt
			}
			if left := deadline.Sub(now); left < share {
				share = left
			}
			if share < time.Millisecond {
				share = time.Millisecond
			}
			est, nerr := d.tryNode(ctx, addr, session, share)
			if nerr == nil {
				if est.session != 0 {
					d.setLeader(addr)
				}
				return est, nil
			}
			if nerr.gone {
				return nil, &ConnectionLostError{Reason: fmt.Sprintf("session %d has ended: its locks without a lease may be another's", session), Err: nerr.err}
			}
			if nerr.fatal {
				return nil, nerr.err
			}
			answered = answered || nerr.answered
			attempts = append(attempts, Attempt{Addr: addr, Err: nerr.err})
			switch {
			case nerr.notLead && nerr.leader == avoid && avoid != "":
				namedAvoided = true
			case nerr.notLead && nerr.leader != "":
				queue = append([]string{nerr.leader}, queue...)
			case !nerr.answered, nerr.stopping:
				// A dead old leader must not cost every round its time.
				d.forgetLeader(addr)
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		now := time.Now()
		if !now.Before(deadline) || (!persist && !answered) {
			return nil, unreachable(attempts)
		}
		// An election takes a few heartbeats: do not hammer the nodes.
		wait := pause
		if left := deadline.Sub(now); left < wait {
			wait = left
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		if pause *= 2; pause > maxPause {
			pause = maxPause
		}
		// Keep the report to the latest rounds.
		if keep := 4 * n; len(attempts) > keep {
			attempts = append([]Attempt(nil), attempts[len(attempts)-keep:]...)
		}
	}
}

// unreachable is the error for a connect that found no node: with one
// attempt, that attempt's own error (what a client of a single server
// expects: AccessDenied, LimitReached, connection refused).
func unreachable(attempts []Attempt) error {
	if len(attempts) == 1 {
		return &ConnectError{Attempts: attempts}
	}
	// The latest reason for each address, in the order first tried.
	var latest []Attempt
	for _, a := range attempts {
		found := false
		for i := range latest {
			if latest[i].Addr == a.Addr {
				latest[i].Err, found = a.Err, true
			}
		}
		if !found {
			latest = append(latest, a)
		}
	}
	return &ConnectError{Attempts: latest}
}

// tryNode connects to addr within limit, asks its limits and, on a
// cluster node, opens or resumes the session there.
func (d *dialer) tryNode(ctx context.Context, addr string, session uint64, limit time.Duration) (*established, *nodeError) {
	stage := "connect"
	deadline := time.Now().Add(limit)
	conn, err := d.connect(ctx, addr, deadline)
	if err != nil {
		// A TLS setup that does not match the server's is the same on
		// every node: not tried elsewhere, the user has an option to change.
		var te *TLSError
		return nil, &nodeError{err: err, fatal: errors.As(err, &te)}
	}
	ok := false
	defer func() {
		if !ok {
			// Until the node has answered, an attempt given up ends with a
			// reset: a clean close would end a session the node may just
			// have resumed for it (docs/CLIENTS.md, "Clusters").
			reset(conn)
		}
	}()
	// A paused node accepts (the kernel does) and never answers: the
	// deadline bounds the handshake too; the context, a caller giving up.
	_ = conn.SetDeadline(deadline)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			_ = conn.SetDeadline(time.Unix(1, 0))
		case <-done:
		}
	}()
	rd := bufio.NewReaderSize(conn, 64<<10)
	failed := func(err error, answered bool) *nodeError {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("no answer to %s within %v", stage, limit.Round(time.Millisecond))
		}
		return &nodeError{err: fmt.Errorf("%s: %w", addr, err), answered: answered}
	}
	stage = "Hello"
	helloSent := time.Now()
	resp, err := exchange(conn, rd, &pb.Request{Version: ProtocolVersion, Id: helloID, AccessToken: d.token, Type: pb.RequestType_Hello})
	if err != nil {
		if err == errTLSAnswer {
			return nil, &nodeError{err: &TLSError{Problem: ServerSpeaksTLS, Addr: addr}, fatal: true}
		}
		return nil, failed(err, false)
	}
	var limits Limits
	switch resp.Status {
	case pb.ResponseStatus_Ok:
		limits = limitsOf(resp.Limits)
	case pb.ResponseStatus_InvalidType:
		limits = legacyLimits // a server older than Hello: assume its defaults
	default:
		e := errorOf(pb.RequestType_Hello, resp)
		// Not "answered": a node that turns clients away (LimitReached,
		// ShuttingDown) is no reason to go round the nodes again; the next
		// node is tried.
		return nil, &nodeError{err: e, fatal: resp.Status == pb.ResponseStatus_AccessDenied}
	}
	if !limits.ResumableSessions {
		// Several addresses must be one cluster's nodes: a single server
		// among them shares no locks with the rest, and a client that fell
		// back to it from a node that is down would lock beside a holder of
		// the same key there. (Resuming, it is just a node that cannot
		// serve, below.)
		if session == 0 && len(d.addrs) > 1 {
			return nil, &nodeError{err: &NotOneClusterError{Addr: addr}, fatal: true}
		}
		if session != 0 {
			return nil, &nodeError{err: fmt.Errorf("%s is not a cluster node: it cannot resume a session", addr), answered: true}
		}
		ok = true
		_ = conn.SetDeadline(time.Time{})
		return &established{conn: conn, rd: rd, addr: addr, limits: limits, ackedFrom: helloSent}, nil
	}
	stage = "OpenSession"
	open := &pb.Request{Version: ProtocolVersion, Id: openSessionID, AccessToken: d.token, Type: pb.RequestType_OpenSession, Session: session}
	if d.sessionTTL > 0 {
		open.SessionTtlMicro = toMicros(d.sessionTTL)
	}
	sent := time.Now()
	resp, err = exchange(conn, rd, open)
	if err != nil {
		return nil, failed(err, false)
	}
	switch resp.Status {
	case pb.ResponseStatus_Ok:
		ok = true
		_ = conn.SetDeadline(time.Time{})
		if ttl := micros(resp.SessionTtlMicro); ttl > 0 {
			limits.SessionTimeout = ttl
		}
		return &established{conn: conn, rd: rd, addr: addr, limits: limits, session: resp.Session, ackedFrom: sent}, nil
	case pb.ResponseStatus_NotLeader:
		why := "not the leader, and no leader is known yet"
		if resp.LeaderAddr != "" {
			why = "not the leader (the leader is " + resp.LeaderAddr + ")"
		}
		return nil, &nodeError{err: errors.New(why), notLead: true, leader: resp.LeaderAddr, answered: true}
	case pb.ResponseStatus_ShuttingDown:
		// Stopping: as NotLeader naming no leader (it is not tried first
		// as the last leader any more); the next node is tried.
		return nil, &nodeError{err: errorOf(pb.RequestType_OpenSession, resp), notLead: true, stopping: true, answered: true}
	case pb.ResponseStatus_UnknownSession:
		if session != 0 {
			return nil, &nodeError{err: errorOf(pb.RequestType_OpenSession, resp), gone: true}
		}
	case pb.ResponseStatus_AccessDenied, pb.ResponseStatus_InvalidArgument:
		return nil, &nodeError{err: errorOf(pb.RequestType_OpenSession, resp), fatal: true}
	}
	return nil, &nodeError{err: errorOf(pb.RequestType_OpenSession, resp), answered: true}
}

// connect makes the TCP (and TLS) connection to addr by deadline.
func (d *dialer) connect(ctx context.Context, addr string, deadline time.Time) (net.Conn, error) {
	dialer := net.Dialer{Deadline: deadline, KeepAlive: 10 * time.Second}
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if d.tls == nil {
		return conn, nil
	}
	cfg := d.tls.Clone()
	if cfg.ServerName == "" {
		// The server's certificate must name the host dialled (an IP
		// literal is checked against its IP names).
		host, _, _ := net.SplitHostPort(addr)
		cfg.ServerName = host
	}
	if len(cfg.NextProtos) == 0 {
		// Offer dlock's TLS protocol name, as the Rust client does: a
		// client port names none and takes any client, a cluster's TLS peer
		// port refuses it at once (no_application_protocol), by which a
		// client given that port is told so. A configuration that names
		// protocols of its own is left as the user made it.
		cfg.NextProtos = []string{ClientALPN}
	}
	if !cfg.InsecureSkipVerify {
		own := cfg.VerifyConnection
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if err := caAsOwn(cs); err != nil {
				return err
			}
			if own != nil {
				return own(cs)
			}
			return nil
		}
	}
	tc := tls.Client(conn, cfg)
	_ = tc.SetDeadline(deadline)
	if err := tc.HandshakeContext(ctx); err != nil {
		reset(conn)
		var rh tls.RecordHeaderError
		var ca *caAsOwnError
		switch {
		case errors.As(err, &rh) && rh.Conn != nil:
			// crypto/tls sets Conn when the first record is no TLS.
			return nil, &TLSError{Problem: ServerSpeaksNoTLS, Addr: addr, Err: err}
		case errors.As(err, &ca):
			return nil, &TLSError{Problem: CAUsedAsServerCertificate, Addr: addr, Err: err}
		case isNoApplicationProtocol(err):
			return nil, &TLSError{Problem: NotAClientPort, Addr: addr, Err: err}
		}
		return nil, fmt.Errorf("TLS handshake with %s failed: %w%s", addr, err, certificateHint(addr, err))
	}
	return tc, nil
}

// certificateHint is what to change when the handshake failed on the
// server's certificate, as " (...)" after crypto/x509's words, else ""
// (as with_certificate_hint of src/transport.rs in the Rust client).
func certificateHint(addr string, err error) string {
	host := addr
	if h, _, e := net.SplitHostPort(addr); e == nil {
		host = h
	}
	var unknown x509.UnknownAuthorityError
	var misnamed x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &unknown):
		return " (the server's certificate is not signed by the CA this client trusts: give " +
			"Options.TLS (DLOCK_TLS_CA) the CA file that signed it, the ca.pem of `dlock-server cert`)"
	case errors.As(err, &misnamed):
		return fmt.Sprintf(" (the server's certificate does not name %s: dial a name or address it "+
			"holds, or give the server a certificate for %s (dlock-server cert create-node NAME --addr %s))",
			host, host, host)
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return " (the server's certificate is not valid now (expired, or the clocks disagree): " +
			"renew it (dlock-server cert create-node) and send the server SIGHUP)"
	}
	return ""
}

// ClientALPN is the TLS protocol name (ALPN) this client offers when
// Options.TLS names none: dlock_proto::tls::CLIENT_ALPN, which the Rust
// client offers too.
const ClientALPN = "dlock"

// isNoApplicationProtocol is whether a handshake failed on the server's
// alert no_application_protocol (120). crypto/tls keeps its alert type
// unexported; the alert's text is how it says so ("remote error: tls: no
// application protocol").
func isNoApplicationProtocol(err error) bool {
	return strings.Contains(err.Error(), "tls: no application protocol")
}

// caAsOwnError is a server certificate with basic constraints CA:TRUE.
type caAsOwnError struct{ subject string }

func (e *caAsOwnError) Error() string {
	return fmt.Sprintf("its certificate %q has basic constraints CA:TRUE", e.subject)
}

// caAsOwn refuses a server that presents a CA certificate as its own.
// crypto/tls accepts one that is in the CA file itself (one self-signed
// certificate given as both the server's and the clients' CA); rustls, so
// the Rust client and dlock, refuse it (CaUsedAsEndEntity), and so does
// this client.
func caAsOwn(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return nil
	}
	if leaf := cs.PeerCertificates[0]; leaf.BasicConstraintsValid && leaf.IsCA {
		return &caAsOwnError{subject: leaf.Subject.String()}
	}
	return nil
}

// errTLSAnswer is a first answer that is a TLS record: the server speaks
// TLS to a client without it.
var errTLSAnswer = errors.New("the answer is a TLS record")

// looksLikeTLS is whether the first bytes of an answer are a TLS record
// header (an alert or a handshake, versions 3.x): a TLS server's answer to
// a plain client, which must not be read as a frame length (0x15030300
// would claim a frame of 352 MB).
func looksLikeTLS(b []byte) bool {
	return len(b) >= 3 && (b[0] == 0x15 || b[0] == 0x16) && b[1] == 0x03 && b[2] <= 0x04
}

// exchange sends req and reads its answer, before a link takes the stream.
func exchange(w io.Writer, rd *bufio.Reader, req *pb.Request) (*pb.Response, error) {
	frame, err := encodeFrame(nil, req)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(frame); err != nil {
		return nil, err
	}
	if head, _ := rd.Peek(3); looksLikeTLS(head) {
		return nil, errTLSAnswer
	}
	resp, err := readFrame(rd)
	if err != nil {
		return nil, err
	}
	// request_id 0 with an error: the server turned the connection away
	// (too many connections) before reading anything.
	if resp.RequestId != req.Id && !(resp.RequestId == 0 && resp.Status != pb.ResponseStatus_Ok) {
		return nil, fmt.Errorf("answer to request %d, expected %d", resp.RequestId, req.Id)
	}
	return resp, nil
}

// encodeFrame appends req, length-prefixed, to buf.
func encodeFrame(buf []byte, req *pb.Request) ([]byte, error) {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0)
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, req)
	if err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(len(buf)-start-4))
	return buf, nil
}

// readFrame reads one answer: exactly 4 bytes of length, then that many,
// refusing a length over maxAnswer instead of allocating it.
func readFrame(rd *bufio.Reader) (*pb.Response, error) {
	var size [4]byte
	if _, err := io.ReadFull(rd, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n > maxAnswer {
		return nil, fmt.Errorf("answer of %d bytes is over the client's limit of %d", n, maxAnswer)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	resp := &pb.Response{}
	if err := proto.Unmarshal(body, resp); err != nil {
		return nil, fmt.Errorf("undecodable answer: %w", err)
	}
	return resp, nil
}

// reset closes conn with an RST, not a FIN: a cluster node ends a session
// at once when its connection is closed cleanly, and the session is to be
// resumed elsewhere. (SO_LINGER on with a timeout of 0 makes close reset.)
func reset(conn net.Conn) {
	raw := conn
	if tc, ok := conn.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	if tcp, ok := raw.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = raw.Close()
}
