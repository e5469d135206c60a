package dlock

import (
	"context"
	"time"

	pb "dlock/clients/go/dlockpb"
)

// Queued is an Enqueue waiting in line: Wait collects the grant.
type Queued struct {
	c      *Client
	keys   []string
	lease  time.Duration
	sent   time.Time
	Ticket uint64
	// Place is how many requests were ahead of it, over its keys, when it
	// was answered (it only goes down).
	Place uint32
}

// Enqueue is a Lock in two steps: answered at once with the Lock when the
// keys are free, or with a Queued place in line whose Wait collects the
// grant (one of the two is nil). The request keeps its FIFO place
// meanwhile (on a cluster, across a change of leader too); opts.Wait
// counts from now.
//
// A Queued belongs to the client's connection until its Wait is answered:
// answers come in request order, so a Wait holds back the answers to calls
// made after it; while that matters, enqueue on a Client of its own.
func (c *Client) Enqueue(ctx context.Context, keys []string, opts *LockOptions) (*Lock, *Queued, error) {
	var o LockOptions
	if opts != nil {
		o = *opts
	}
	body := lockBody(ctx, keys, &o)
	sent := time.Now()
	resp, err := c.l.call(ctx, pb.RequestType_Enqueue, body, keys)
	if err != nil {
		return nil, nil, tryErr(err, o.Try)
	}
	if resp.Status == pb.ResponseStatus_Queued {
		return nil, &Queued{c: c, keys: keys, lease: o.Lease, sent: sent, Ticket: resp.Ticket, Place: resp.Place}, nil
	}
	l, err := c.granted(ctx, c.l, keys, resp.Fence, o.Lease, sent)
	return l, nil, err
}

// Wait waits for the queued request's grant and returns its Lock; as Lock,
// ErrTimeout when the Enqueue's wait limit passes. If ctx ends first, a
// grant that arrives later is released.
func (q *Queued) Wait(ctx context.Context) (*Lock, error) {
	resp, err := q.c.l.call(ctx, pb.RequestType_Wait, &pb.RequestLock{Ticket: q.Ticket}, q.keys)
	if err != nil {
		return nil, err
	}
	return q.c.granted(ctx, q.c.l, q.keys, resp.Fence, q.lease, q.sent)
}
