package dlock

import (
	"testing"
	"time"

	pb "dlock/clients/go/dlockpb"
)

// A lease outlives its session: its Unlock, queued while the session moves
// (the path to the node broke) and never sent because the session ended
// instead of resuming, is sent again by fence on a connection opened for
// it, and Unlock returns nil once that released the key.
func TestALeasesUnlockQueuedWhileItsSessionMovesIsSentAgainWhenTheSessionEnds(t *testing.T) {
	cl := startCluster(t, 1)
	node := cl.Addrs[0]
	ctx := testCtx(t)
	fw := startForwarder(t, node)
	moving := make(chan struct{}, 1)
	onEvent := func(e Event) {
		if e.Kind == Reconnecting {
			select {
			case moving <- struct{}{}:
			default:
			}
		}
	}
	c := connect(t, fw.Addr, &Options{OnEvent: onEvent}) // the forwarder's connection 0
	other := connect(t, node, nil)
	key := []string{"moving"}
	lock, err := c.Lock(ctx, key, &LockOptions{Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// The path breaks and stays cut: the session moves, its resume held in
	// the forwarder.
	fw.freeze()
	fw.reset(0)
	select {
	case <-moving:
	case <-time.After(limit):
		t.Fatal("the session did not move")
	}
	unlocked := make(chan error, 1)
	go func() { unlocked <- lock.Unlock(ctx) }() // queued: the session has no stream now
	// The session ends meanwhile (as when its TTL runs out while no node
	// keeps it): resumed on a connection of the test's, and closed there.
	session := c.Session()
	answers, err := rawExchange(node, [][]byte{
		rawFrame(&pb.Request{Version: 2, Id: 1, Type: pb.RequestType_OpenSession, Session: session}),
		rawFrame(&pb.Request{Version: 2, Id: 2, Type: pb.RequestType_CloseSession, Session: session}),
	}, 2, limit)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range answers {
		if a.Status != pb.ResponseStatus_Ok {
			t.Fatalf("ending session %d: %v %s", session, a.Status, a.ErrorText)
		}
	}
	fw.thaw() // the resume is answered UnknownSession
	select {
	case err := <-unlocked:
		if err != nil {
			t.Fatalf("the Unlock: %v", err)
		}
	case <-time.After(limit):
		t.Fatal("the Unlock did not return")
	}
	i, err := other.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if h := i[0].First(); h != nil {
		t.Fatalf("the lease is still held: %+v", h)
	}
}
