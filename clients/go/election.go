package dlock

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// Election is leader election on one key, as the Rust library's and the
// Python client's (after etcd's concurrency.Election): campaigners queue
// for the key (FIFO, like any Lock), the holder leads, and its hold's value
// says who it is.
type Election struct {
	c   *Client
	key string
}

// Leader is who leads an election.
type Leader struct {
	// Value it campaigned with, or proclaimed since.
	Value []byte
	// Fence of its leadership: higher for every later leader.
	Fence uint64
	// HeldFor: how long it has led, when the server says.
	HeldFor time.Duration
}

func leaderOf(k KeyInfo) *Leader {
	f := k.First()
	if f == nil {
		return nil
	}
	return &Leader{Value: f.Value, Fence: f.Fence, HeldFor: f.HeldFor}
}

// Election is the election on key.
func (c *Client) Election(key string) *Election { return &Election{c: c, key: key} }

// Campaign waits until this campaigner leads, in line behind earlier ones,
// announcing value (at most 1024 bytes), and returns the leadership: a Lock
// without a lease (taken as Lock takes it: on the client's connection, or
// on one of its own if it waited), so a leader whose process ends hands
// over at once. Campaigners of one Client take turns as any others do. Lost says when leading
// can no longer be assumed: besides a Lock's reasons, at once when the key
// is taken from the leader (released by fence by someone else), which a
// Watch kept on it while it leads reports (LostNotHeld). ctx ending
// withdraws the campaign as it does a Lock.
func (e *Election) Campaign(ctx context.Context, value []byte) (*Lock, error) {
	l, err := e.c.Lock(ctx, []string{e.key}, &LockOptions{Value: value})
	if err != nil {
		return nil, err
	}
	go e.watchLeadership(l, value)
	return l, nil
}

// watchLeadership watches the key while l leads: when its first holder is
// no longer l, the leadership is lost. It stops when l is unlocked or lost,
// or the client ends. A Watch that fails is tried again after a pause of
// 250 ms doubling up to 5 s, as in Observe.
func (e *Election) watchLeadership(l *Lock, value []byte) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.ended:
		case <-e.c.Done():
		case <-ctx.Done():
		}
		cancel()
	}()
	known := value
	pause := 250 * time.Millisecond
	for ctx.Err() == nil {
		info, err := e.c.Watch(ctx, e.key, l.fence, known, 0)
		if err != nil {
			if !backOff(ctx, &pause) {
				return
			}
			continue
		}
		pause = 250 * time.Millisecond
		f := info.First()
		if f != nil && f.Fence == l.fence {
			known = f.Value // proclaimed anew: still leading
			continue
		}
		holder := "nobody holds it"
		if f != nil {
			holder = fmt.Sprintf("fence %d holds it", f.Fence)
		}
		l.setLost(LostNotHeld, fmt.Sprintf("the key %q was taken from the leader (%s)", e.key, holder), nil)
		return
	}
}

// Leader says who leads now; nil when nobody does.
func (e *Election) Leader(ctx context.Context) (*Leader, error) {
	info, err := e.c.Inspect(ctx, []string{e.key})
	if err != nil {
		return nil, err
	}
	return leaderOf(info[0]), nil
}

// Observe sends the leader now, then every change (nil: nobody leads),
// pushed by the server through Watch, until ctx ends or the client does;
// then it closes the channel. A Watch that fails (a cluster between
// leaders, a server at its limit of Watches) is tried again after a pause
// of 250 ms doubling up to 5 s.
func (e *Election) Observe(ctx context.Context) <-chan *Leader {
	out := make(chan *Leader, 1)
	go func() {
		defer close(out)
		var known *Leader
		first := true
		pause := 250 * time.Millisecond
		for ctx.Err() == nil && e.c.Err() == nil {
			var fence uint64
			var value []byte
			if known != nil {
				fence, value = known.Fence, known.Value
			}
			info, err := e.c.Watch(ctx, e.key, fence, value, 0)
			if err != nil {
				if !backOff(ctx, &pause) {
					return
				}
				continue
			}
			pause = 250 * time.Millisecond
			now := leaderOf(info)
			if first || !sameLeader(now, known) {
				first = false
				known = now
				select {
				case out <- now:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

func sameLeader(a, b *Leader) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Fence == b.Fence && bytes.Equal(a.Value, b.Value)
}

// backOff waits *pause (a Watch was refused or failed: a server that keeps
// refusing is not polled), then doubles it up to 5 s. It returns false if
// ctx ended first.
func backOff(ctx context.Context, pause *time.Duration) bool {
	t := time.NewTimer(*pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	if *pause *= 2; *pause > 5*time.Second {
		*pause = 5 * time.Second
	}
	return true
}
