package dlock

import (
	"errors"
	"fmt"
	"strings"

	pb "dlock/clients/go/dlockpb"
)

// Sentinels to test errors with errors.Is. Every error this package returns
// for a refusal is a *ServerError, for a broken connection a
// *ConnectionLostError, for a lost lock a *LostError; each says which of
// these it is.
var (
	// ErrBusy: a Lock that was not to wait (LockOptions.Try) found keys busy.
	ErrBusy = errors.New("dlock: keys busy")
	// ErrTimeout: the wait limit passed with keys still busy (AcquireTimeout).
	ErrTimeout = errors.New("dlock: lock not acquired in time")
	// ErrAccessDenied: the token is missing, wrong, or has no rule for the keys.
	ErrAccessDenied = errors.New("dlock: access denied")
	// ErrNotHeld: Unlock, Renew or Proclaim named keys not held (under that fence).
	ErrNotHeld = errors.New("dlock: keys not held")
	// ErrNotLeader: a cluster node that does not lead refused the request.
	ErrNotLeader = errors.New("dlock: not the leader")
	// ErrUnavailable: a cluster could not commit in time, or no server
	// could be reached to connect or resume a session.
	ErrUnavailable = errors.New("dlock: unavailable")
	// ErrConnectionLost: the connection (on a cluster: the session) ended;
	// the server released every lock it held without a lease.
	ErrConnectionLost = errors.New("dlock: connection lost")
	// ErrLockLost: a lock can no longer be assumed held (see Lock.Err).
	ErrLockLost = errors.New("dlock: lock lost")
	// ErrTLSMismatch: the client's TLS setup does not fit the server's
	// (see TLSError).
	ErrTLSMismatch = errors.New("dlock: TLS setup does not match the server's")
	// ErrNotOneCluster: several servers were given and one is a single
	// server, not a cluster node (see NotOneClusterError).
	ErrNotOneCluster = errors.New("dlock: several servers that are not one cluster")
)

// ServerError is a request the server refused: its status, its explanation
// (which names the key, limit or option at fault) and the keys it lists.
type ServerError struct {
	// Request is the type of the request refused.
	Request pb.RequestType
	Status  pb.ResponseStatus
	// Text is the server's error_text.
	Text string
	// Keys the answer lists: busy keys (AcquireTimeout), keys not held
	// (NotHeld), keys in conflict (ModeConflict, LimitMismatch).
	Keys []string
	// Leader is the leader's address a NotLeader answer names, if known.
	Leader string
	// try marks an AcquireTimeout to a try-lock: ErrBusy, not ErrTimeout.
	try bool
}

func (e *ServerError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dlock: %s refused: %s", e.Request, e.Status)
	if e.Text != "" {
		fmt.Fprintf(&b, ": %s", e.Text)
	}
	if len(e.Keys) > 0 && !strings.Contains(e.Text, e.Keys[0]) {
		fmt.Fprintf(&b, " (keys %q)", e.Keys)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrBusy) and the other sentinels work.
func (e *ServerError) Is(target error) bool {
	switch target {
	case ErrBusy:
		return e.Status == pb.ResponseStatus_AcquireTimeout && e.try
	case ErrTimeout:
		return e.Status == pb.ResponseStatus_AcquireTimeout && !e.try
	case ErrAccessDenied:
		return e.Status == pb.ResponseStatus_AccessDenied
	case ErrNotHeld:
		return e.Status == pb.ResponseStatus_NotHeld
	case ErrNotLeader:
		return e.Status == pb.ResponseStatus_NotLeader
	case ErrUnavailable:
		return e.Status == pb.ResponseStatus_Unavailable
	case ErrConnectionLost:
		// The cluster ended the session: as good as a lost connection.
		return e.Status == pb.ResponseStatus_UnknownSession
	}
	return false
}

// errorOf is the error for a non-Ok answer to a request of type kind; nil
// for Ok (and for Queued, an Enqueue's answer that is no error).
func errorOf(kind pb.RequestType, resp *pb.Response) error {
	switch resp.Status {
	case pb.ResponseStatus_Ok:
		return nil
	case pb.ResponseStatus_Queued:
		if kind == pb.RequestType_Enqueue {
			return nil
		}
	}
	return &ServerError{
		Request: kind,
		Status:  resp.Status,
		Text:    resp.ErrorText,
		Keys:    resp.Keys,
		Leader:  resp.LeaderAddr,
	}
}

// ConnectionLostError says why a connection (on a cluster: a session)
// ended. Every call pending on it, and every later one, fails with it.
type ConnectionLostError struct {
	// Reason says what happened, naming the node.
	Reason string
	// Err is the I/O or decoding error that ended it, if one did.
	Err error
}

func (e *ConnectionLostError) Error() string {
	if e.Err != nil && !strings.Contains(e.Reason, e.Err.Error()) {
		return fmt.Sprintf("dlock: connection lost: %s: %v", e.Reason, e.Err)
	}
	return "dlock: connection lost: " + e.Reason
}

// Is makes errors.Is(err, ErrConnectionLost) work.
func (e *ConnectionLostError) Is(target error) bool { return target == ErrConnectionLost }

// Unwrap gives the cause.
func (e *ConnectionLostError) Unwrap() error { return e.Err }

// Attempt is one address tried while connecting, and why it did not serve.
type Attempt struct {
	Addr string
	Err  error
}

// ConnectError is a connect (or a session's resume) that found no server
// to use: every address tried and why each failed.
type ConnectError struct {
	Attempts []Attempt
}

func (e *ConnectError) Error() string {
	parts := make([]string, 0, len(e.Attempts))
	for _, a := range e.Attempts {
		parts = append(parts, fmt.Sprintf("%s: %v", a.Addr, a.Err))
	}
	if len(parts) == 0 {
		return "dlock: no server to connect to"
	}
	return "dlock: no server reachable: " + strings.Join(parts, "; ")
}

// Is makes errors.Is(err, ErrUnavailable) true (no server could be used),
// and errors.Is(err, ErrAccessDenied) for a refused token: it looks into
// every attempt (by hand: Go 1.19's errors has no multiple unwrapping).
func (e *ConnectError) Is(target error) bool {
	if target == ErrUnavailable {
		return true
	}
	for _, a := range e.Attempts {
		if errors.Is(a.Err, target) {
			return true
		}
	}
	return false
}

// As finds an attempt's error of target's type (a *ServerError, say).
func (e *ConnectError) As(target interface{}) bool {
	for _, a := range e.Attempts {
		if errors.As(a.Err, target) {
			return true
		}
	}
	return false
}

// LostReason is why a lock can no longer be assumed held.
type LostReason int

const (
	// LostConnection: the connection (on a cluster: the session) of a lock
	// without a lease ended; the server released the lock.
	LostConnection LostReason = iota + 1
	// LostDeadline: no answer from the server proves the lock held much
	// longer; its safety deadline is within the margin. The server may
	// hand it on after Lock.Deadline.
	LostDeadline
	// LostNotHeld: the server says the keys are not held under this fence
	// (the lease ran out, or someone released it by fence).
	LostNotHeld
	// LostRenewRefused: the server refused to renew the lease for another reason.
	LostRenewRefused
	// LostRegranted is no longer reported: every Lock has an owner of its
	// own, so no key is granted twice to one owner (kept for API
	// compatibility; it once said a later Lock of the same Client was
	// granted a key of this one).
	LostRegranted
	// LostClosed: the client was closed.
	LostClosed
)

func (r LostReason) String() string {
	switch r {
	case LostConnection:
		return "connection lost"
	case LostDeadline:
		return "safety deadline"
	case LostNotHeld:
		return "not held"
	case LostRenewRefused:
		return "renew refused"
	case LostRegranted:
		return "granted again"
	case LostClosed:
		return "client closed"
	}
	return fmt.Sprintf("LostReason(%d)", int(r))
}

// LostError is what Lock.Err returns once the lock is lost.
type LostError struct {
	Reason LostReason
	Keys   []string
	Fence  uint64
	// Text says what happened.
	Text string
	// Err is the error behind it (a ConnectionLostError, a ServerError).
	Err error
}

func (e *LostError) Error() string {
	return fmt.Sprintf("dlock: lock on %q (fence %d) lost: %s", e.Keys, e.Fence, e.Text)
}

// Is makes errors.Is(err, ErrLockLost) work; a loss through the connection
// also matches ErrConnectionLost, one through NotHeld ErrNotHeld.
func (e *LostError) Is(target error) bool { return target == ErrLockLost }

// Unwrap gives the cause.
func (e *LostError) Unwrap() error { return e.Err }

// TLSProblem is what a TLSError found.
type TLSProblem int

const (
	// ServerSpeaksTLS: a client without TLS reached a server that speaks
	// TLS (it answered with a TLS record).
	ServerSpeaksTLS TLSProblem = iota + 1
	// ServerSpeaksNoTLS: a TLS client's handshake found no TLS at the
	// server (what came back is no TLS record).
	ServerSpeaksNoTLS
	// CAUsedAsServerCertificate: the server presented a CA certificate
	// (basic constraints CA:TRUE) as its own, as when one self-signed
	// certificate is both the server's and the clients' CA. crypto/tls
	// accepts it when it is in the CA file; this client refuses it, as the
	// other dlock clients' TLS does (unless Options.TLS skips verification).
	CAUsedAsServerCertificate
	// NotAClientPort: the server's TLS refused the protocol name (ALPN)
	// "dlock" that this client offers, with the alert
	// no_application_protocol: it is no dlock client port, most likely a
	// cluster node's peer port (its --peer-listen), which names its own.
	NotAClientPort
)

func (p TLSProblem) String() string {
	switch p {
	case ServerSpeaksTLS:
		return "server speaks TLS"
	case ServerSpeaksNoTLS:
		return "server does not speak TLS"
	case CAUsedAsServerCertificate:
		return "CA certificate used as the server's"
	case NotAClientPort:
		return "not a client port"
	}
	return fmt.Sprintf("TLSProblem(%d)", int(p))
}

// TLSError is a connect whose TLS setup does not match the server's; its
// message says what to change. Connect returns it as it is, without trying
// the other servers: a cluster's nodes share their TLS setup. It matches
// ErrTLSMismatch and ErrUnavailable (the server cannot be used).
type TLSError struct {
	Problem TLSProblem
	// Addr is the server's address.
	Addr string
	// Err is what the TLS handshake found (nil for ServerSpeaksTLS).
	Err error
}

func (e *TLSError) Error() string {
	switch e.Problem {
	case ServerSpeaksTLS:
		return fmt.Sprintf("dlock: the server at %s speaks TLS: give the CA certificate that signed its certificate with Options.TLS (DLOCK_TLS_CA)", e.Addr)
	case ServerSpeaksNoTLS:
		return fmt.Sprintf("dlock: the server at %s does not speak TLS (%v): connect without Options.TLS (DLOCK_TLS_CA), or start dlock-server with --tls-cert and --tls-key", e.Addr, e.Err)
	case CAUsedAsServerCertificate:
		return fmt.Sprintf("dlock: the server at %s presents a CA certificate as its own (%v): make a CA and a server certificate signed by it (dlock-server cert create-ca, then create-node), give the server the node's and the clients the CA's", e.Addr, e.Err)
	case NotAClientPort:
		// The words of the Rust client's Error::NotAClientPort.
		return fmt.Sprintf("dlock: the server at %s refuses dlock's TLS protocol name (%v): it is no dlock client port, most likely a cluster node's peer port (its --peer-listen): give a client port instead (a node's --listen)", e.Addr, e.Err)
	}
	return fmt.Sprintf("dlock: TLS with %s: %v: %v", e.Addr, e.Problem, e.Err)
}

// Is makes errors.Is(err, ErrTLSMismatch) and errors.Is(err,
// ErrUnavailable) work.
func (e *TLSError) Is(target error) bool {
	return target == ErrTLSMismatch || target == ErrUnavailable
}

// Unwrap gives what the handshake found.
func (e *TLSError) Unwrap() error { return e.Err }

// NotOneClusterError is a connect given several servers whose node that
// answered is a single server, not a node of a cluster (its Hello limits do
// not say ResumableSessions). A list must name one cluster's nodes: single
// servers share no locks, so a client that moved on to the next when the
// first was down would lock beside a holder of the same key on the first.
// Connect returns it at once, without trying the other servers. It matches
// ErrNotOneCluster; the Rust client's Error::NotOneCluster.
type NotOneClusterError struct {
	// Addr is the single server's address.
	Addr string
}

func (e *NotOneClusterError) Error() string {
	return fmt.Sprintf("dlock: %s is a single server, not a cluster node: several addresses must be the nodes of one cluster, since single servers share no locks (give this server's address alone)", e.Addr)
}

// Is makes errors.Is(err, ErrNotOneCluster) work.
func (e *NotOneClusterError) Is(target error) bool { return target == ErrNotOneCluster }
