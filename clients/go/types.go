package dlock

import (
	"time"

	pb "dlock/clients/go/dlockpb"
)

// Limits is what the server said in answer to Hello.
type Limits struct {
	// SessionTimeout: the server may end a connection from which no request
	// arrived for this long, releasing its locks without a lease. On a
	// cluster: the session's TTL.
	SessionTimeout time.Duration
	MaxLease       time.Duration
	MaxKeys        uint32
	MaxKeyLen      uint32
	// MaxFrame is the largest request body the server takes; a larger one
	// would end the connection, so the client refuses to send it.
	MaxFrame    uint32
	MaxPipeline uint32
	// ResumableSessions: a cluster node, whose sessions outlive a broken
	// connection for their TTL.
	ResumableSessions bool
	// ElectionTimeout of a cluster node; 0 when it does not say.
	ElectionTimeout time.Duration
}

// legacyLimits are assumed for a server older than Hello (it answers
// InvalidType): its defaults, and the 60 s idle timeout of those servers.
var legacyLimits = Limits{
	SessionTimeout: 60 * time.Second,
	MaxLease:       30 * 24 * time.Hour,
	MaxKeys:        256,
	MaxKeyLen:      1024,
	MaxFrame:       16384,
	MaxPipeline:    1024,
}

func limitsOf(l *pb.ServerLimits) Limits {
	return Limits{
		SessionTimeout:    micros(l.GetSessionTimeoutMicro()),
		MaxLease:          micros(l.GetMaxLeaseMicro()),
		MaxKeys:           l.GetMaxKeys(),
		MaxKeyLen:         l.GetMaxKeyLen(),
		MaxFrame:          l.GetMaxFrame(),
		MaxPipeline:       l.GetMaxPipeline(),
		ResumableSessions: l.GetResumableSessions(),
		ElectionTimeout:   micros(l.GetElectionTimeoutMicro()),
	}
}

// micros is a count of microseconds as a Duration, saturating.
func micros(us uint64) time.Duration {
	const max = uint64(1<<63-1) / 1000
	if us > max {
		us = max
	}
	return time.Duration(us) * time.Microsecond
}

// wireLease is a lease as the server takes it: whole microseconds, at
// least one (0 or less: none), so a lock's deadline never counts on the
// nanoseconds toMicros drops.
func wireLease(d time.Duration) time.Duration {
	return time.Duration(toMicros(d)) * time.Microsecond
}

// toMicros is d in whole microseconds, at least 1 for a positive d (a
// positive limit below a microsecond still means "a little", not "none").
func toMicros(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	us := uint64(d / time.Microsecond)
	if us == 0 {
		return 1
	}
	return us
}

// KeyHolder is one holder of a key.
type KeyHolder struct {
	Fence uint64
	// LeaseRemaining until its lease ends; 0 when held without a lease.
	LeaseRemaining time.Duration
	// HeldByCaller: held by the connection (or session) that asked.
	HeldByCaller bool
	// Addr of the holder's connection, when it is connected.
	Addr  string
	Value []byte
	// HeldFor: how long it has held.
	HeldFor time.Duration
}

// KeyInfo is a key as Inspect or Watch saw it.
type KeyInfo struct {
	Key string
	// Holders, by fence; empty when the key is free. Of a key with
	// thousands of them, the server may list only the oldest, the
	// caller's own and the latest (see HoldersOmitted).
	Holders []KeyHolder
	// HoldersOmitted: holders the server left out (never the caller's),
	// to keep its answer within 4 MiB; 0 when Holders lists every one.
	HoldersOmitted uint32
	Shared         bool
	// Limit the shared holders agreed on; 0 = none.
	Limit   uint32
	Waiters uint32
}

// First is the holder with the lowest fence (of a key held exclusively,
// the only one); nil when the key is free.
func (k KeyInfo) First() *KeyHolder {
	if len(k.Holders) == 0 {
		return nil
	}
	return &k.Holders[0]
}

func keyInfoOf(i *pb.KeyInfo) KeyInfo {
	k := KeyInfo{Key: i.Key, Shared: i.Shared, Limit: i.Limit, Waiters: i.Waiters, HoldersOmitted: i.HoldersOmitted}
	if len(i.Holders) > 0 {
		for _, h := range i.Holders {
			k.Holders = append(k.Holders, KeyHolder{
				Fence: h.Fence, LeaseRemaining: micros(h.LeaseRemainingMicro), HeldByCaller: h.HeldByCaller,
				Addr: h.HolderAddr, Value: h.Value, HeldFor: micros(h.HeldMicro),
			})
		}
	} else if i.Fence != 0 {
		k.Holders = []KeyHolder{{
			Fence: i.Fence, LeaseRemaining: micros(i.LeaseRemainingMicro), HeldByCaller: i.HeldByCaller,
			Addr: i.HolderAddr, Value: i.Value, HeldFor: micros(i.HeldMicro),
		}}
	}
	return k
}

// ServerStats are the server's counts.
type ServerStats struct {
	Connections     uint64
	HeldKeys        uint64
	WaitingRequests uint64
}

// EventKind says what an Event reports.
type EventKind int

const (
	// Reconnecting: the connection to Addr broke (Reason says how); the
	// client resumes its session elsewhere.
	Reconnecting EventKind = iota + 1
	// Resumed: the session was resumed on Addr, After the break.
	Resumed
)

func (k EventKind) String() string {
	switch k {
	case Reconnecting:
		return "reconnecting"
	case Resumed:
		return "resumed"
	}
	return "unknown event"
}

// Event reports a move of a client's session between cluster nodes.
type Event struct {
	Kind    EventKind
	Addr    string
	Session uint64
	Reason  string
	After   time.Duration
}
