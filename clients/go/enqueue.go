package dlock

import (
	"context"
	"time"

	pb "dlock/clients/go/dlockpb"
)

// Queued is an Enqueue waiting in line: Wait collects the grant.
type Queued struct {
	c *Client
	// ln is the connection it waits on: the client's (claim claims its
	// keys there), or one of its own.
	ln     *link
	claim  *claim
	keys   []string
	lease  time.Duration
	sent   time.Time
	Ticket uint64
	// Place is how many requests were ahead of it, over its keys, when it
	// was answered (it only goes down).
	Place uint32
	// turn lets one Wait run at a time; over (under it) is set once a
	// Wait was sent and answered or given up: the ticket is spent, and a
	// connection of its own belongs to the grant or is gone.
	turn chan struct{}
	over bool
}

// Enqueue is a Lock in two steps: answered at once with the Lock when the
// keys are free, or with a Queued place in line whose Wait collects the
// grant (one of the two is nil). The request keeps its FIFO place
// meanwhile (on a cluster, across a change of leader too); opts.Wait
// counts from now.
//
// Each lock has an owner of its own, as with Lock: the Enqueue is sent on
// the client's connection unless another Lock or Enqueue of this Client
// holds or asks for one of its keys there; then on a connection (on a
// cluster, a session) of its own, which its Lock keeps. On the client's
// connection a Queued waits there until its Wait is answered: answers
// come in request order, so a Wait holds back the answers to calls made
// after it; while that matters, enqueue on a Client of its own.
func (c *Client) Enqueue(ctx context.Context, keys []string, opts *LockOptions) (*Lock, *Queued, error) {
	var o LockOptions
	if opts != nil {
		o = *opts
	}
	ln, cl := c.l, c.claim(keys)
	if cl == nil {
		var err error
		if ln, err = c.asideLink(ctx); err != nil {
			return nil, nil, err
		}
	}
	body := lockBody(ctx, keys, &o)
	sent := time.Now()
	resp, queued, err := ln.callWith(ctx, pb.RequestType_Enqueue, body, callOpts{lockKeys: keys, settled: cl.release})
	if err != nil {
		if !queued {
			cl.release()
		}
		if ln != c.l {
			c.asideFailed(ctx, ln, err)
		}
		return nil, nil, tryErr(err, o.Try)
	}
	if resp.Status == pb.ResponseStatus_Queued {
		return nil, &Queued{c: c, ln: ln, claim: cl, keys: keys, lease: o.Lease, sent: sent,
			Ticket: resp.Ticket, Place: resp.Place, turn: make(chan struct{}, 1)}, nil
	}
	l, err := c.granted(ctx, ln, cl, keys, resp.Fence, o.Lease, sent)
	return l, nil, err
}

// Wait waits for the queued request's grant and returns its Lock; as Lock,
// ErrTimeout when the Enqueue's wait limit passes. If ctx ends first, a
// grant that arrives later is released (on a connection of its own, the
// request is withdrawn). A ticket is collected once: a later Wait is
// refused with UnknownTicket.
func (q *Queued) Wait(ctx context.Context) (*Lock, error) {
	select {
	case q.turn <- struct{}{}:
		defer func() { <-q.turn }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if q.over {
		return nil, &ServerError{Request: pb.RequestType_Wait, Status: pb.ResponseStatus_UnknownTicket,
			Text: "the ticket was collected by an earlier Wait (not sent)"}
	}
	own := q.ln != q.c.l
	resp, queued, err := q.ln.callWith(ctx, pb.RequestType_Wait, &pb.RequestLock{Ticket: q.Ticket},
		callOpts{lockKeys: q.keys, settled: q.claim.release})
	q.over = queued
	if err != nil {
		if own && queued {
			q.c.asideFailed(ctx, q.ln, err)
		}
		return nil, err
	}
	return q.c.granted(ctx, q.ln, q.claim, q.keys, resp.Fence, q.lease, q.sent)
}
