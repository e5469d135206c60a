package dlock

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A leader whose key is released by fence by someone else learns it at
// once through the Watch it keeps; a proclaimed value is not a loss, and
// an Unlock ends the watch without a loss.
func TestALeaderWhoseKeyIsTakenLosesLeadershipAtOnce(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	c, other := connect(t, s.Addr, nil), connect(t, s.Addr, nil)
	e := c.Election("election/taken")
	lead, err := e.Campaign(ctx, []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	// A Proclaim changes the value the Watch knows: still leading. The
	// Observe sees the new value, so the server has applied it, and the
	// leader's Watch was answered for it too.
	if err := other.Proclaim(ctx, lead.Keys(), lead.Fence(), []byte("b")); err != nil {
		t.Fatal(err)
	}
	for l := range other.Election("election/taken").Observe(ctx) {
		if l != nil && string(l.Value) == "b" {
			break
		}
	}
	if err := other.Unlock(ctx, lead.Keys(), lead.Fence()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lead.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the leader was not told within 5 s that its key was taken")
	}
	var lost *LostError
	if !errors.As(lead.Err(), &lost) || lost.Reason != LostNotHeld || !strings.Contains(lost.Text, "nobody holds it") {
		t.Fatalf("leadership lost: %v, want LostNotHeld", lead.Err())
	}

	// Unlocked by its leader: never reported lost.
	again, err := e.Campaign(ctx, []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := other.Election("election/taken").Campaign(ctx, []byte("c"))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Unlock(ctx)
	if err := again.Err(); err != nil {
		t.Fatalf("an unlocked leadership: %v", err)
	}
}
