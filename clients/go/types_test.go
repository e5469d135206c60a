package dlock

import (
	"testing"

	pb "dlock/clients/go/dlockpb"
)

// The server leaves holders out only past 4 MiB of them (the Rust server
// tests provoke it); here, that the count reaches the caller.
func TestHoldersTheServerLeftOutAreCounted(t *testing.T) {
	k := keyInfoOf(&pb.KeyInfo{
		Key: "pool", Fence: 90, Shared: true,
		Holders:        []*pb.KeyHolder{{Fence: 3}, {Fence: 90}},
		HoldersOmitted: 4000,
	})
	if len(k.Holders) != 2 || k.Holders[0].Fence != 3 || k.Holders[1].Fence != 90 {
		t.Fatalf("holders %+v", k.Holders)
	}
	if k.HoldersOmitted != 4000 {
		t.Fatalf("HoldersOmitted %d", k.HoldersOmitted)
	}
}
