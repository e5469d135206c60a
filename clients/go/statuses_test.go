package dlock

// Every ResponseStatus, provoked for real and seen as the error the client
// returns. Statuses a correct client never causes (General, Version,
// InvalidType, FrameTooLarge from the server) are provoked with raw frames,
// which also checks the framing from the outside. NotLeader is provoked in
// cluster_test.go; Unavailable here, on a leader whose followers are gone
// (answering its clients' probe).

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "dlock/clients/go/dlockpb"
)

var covered = map[pb.ResponseStatus]bool{}

func covers(t *testing.T, statuses ...pb.ResponseStatus) {
	t.Cleanup(func() {
		if !t.Failed() {
			for _, s := range statuses {
				covered[s] = true
			}
		}
	})
}

func serverErr(t *testing.T, err error, status pb.ResponseStatus) *ServerError {
	t.Helper()
	var se *ServerError
	if !errors.As(err, &se) || se.Status != status {
		t.Fatalf("want %v, got %v", status, err)
	}
	if se.Text == "" && status != pb.ResponseStatus_AcquireTimeout && status != pb.ResponseStatus_NotHeld {
		t.Fatalf("%v without error_text: every refusal explains itself", status)
	}
	return se
}

func TestStatuses(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	c := connect(t, s.Addr, nil)

	t.Run("Ok", func(t *testing.T) {
		covers(t, pb.ResponseStatus_Ok)
		if _, err := c.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("GeneralKeepsTheConnection", func(t *testing.T) {
		covers(t, pb.ResponseStatus_General)
		garbage := []byte{0, 0, 0, 3, 0xff, 0xff, 0xff}
		out, err := rawExchange(s.Addr, [][]byte{garbage, rawFrame(&pb.Request{Version: 2, Id: 9, Type: pb.RequestType_Ping})}, 2, limit)
		if err != nil || out[0].Status != pb.ResponseStatus_General || out[0].RequestId != 0 || out[1].RequestId != 9 {
			t.Fatalf("%v %v", out, err)
		}
	})
	t.Run("Version", func(t *testing.T) {
		covers(t, pb.ResponseStatus_Version)
		resp, err := rawCall(s.Addr, &pb.Request{Version: 3, Id: 1, Type: pb.RequestType_Ping}, limit)
		if err != nil || resp.Status != pb.ResponseStatus_Version {
			t.Fatalf("%v %v", resp, err)
		}
	})
	t.Run("InvalidType", func(t *testing.T) {
		covers(t, pb.ResponseStatus_InvalidType)
		_, err := c.l.call(ctx, pb.RequestType_Invalid, nil, nil)
		serverErr(t, err, pb.ResponseStatus_InvalidType)
	})
	t.Run("TooManyKeys", func(t *testing.T) {
		covers(t, pb.ResponseStatus_TooManyKeys)
		small := startServer(t, "", "--max-keys", "2")
		_, err := connect(t, small.Addr, nil).Lock(ctx, []string{"a", "b", "c"}, nil)
		serverErr(t, err, pb.ResponseStatus_TooManyKeys)
	})
	t.Run("InvalidKey", func(t *testing.T) {
		covers(t, pb.ResponseStatus_InvalidKey)
		_, err := c.Lock(ctx, []string{""}, nil)
		serverErr(t, err, pb.ResponseStatus_InvalidKey)
	})
	t.Run("NoKeys", func(t *testing.T) {
		covers(t, pb.ResponseStatus_NoKeys)
		_, err := c.Lock(ctx, nil, nil)
		serverErr(t, err, pb.ResponseStatus_NoKeys)
	})
	t.Run("InvalidArgument", func(t *testing.T) {
		covers(t, pb.ResponseStatus_InvalidArgument)
		short := startServer(t, "", "--max-lease", "1s")
		_, err := connect(t, short.Addr, nil).Lock(ctx, []string{"k"}, &LockOptions{Lease: 10 * time.Second})
		serverErr(t, err, pb.ResponseStatus_InvalidArgument)
	})
	t.Run("AcquireTimeout", func(t *testing.T) {
		covers(t, pb.ResponseStatus_AcquireTimeout)
		other := connect(t, s.Addr, nil)
		l, err := c.Lock(ctx, []string{"at"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		_, err = other.Lock(ctx, []string{"at"}, &LockOptions{Wait: 10 * time.Millisecond})
		if se := serverErr(t, err, pb.ResponseStatus_AcquireTimeout); !errors.Is(err, ErrTimeout) || len(se.Keys) != 1 {
			t.Fatal(err)
		}
	})
	t.Run("NotHeld", func(t *testing.T) {
		covers(t, pb.ResponseStatus_NotHeld)
		err := c.Unlock(ctx, []string{"a", "b"}, 1)
		if se := serverErr(t, err, pb.ResponseStatus_NotHeld); !errors.Is(err, ErrNotHeld) || strings.Join(se.Keys, ",") != "a,b" {
			t.Fatal(err)
		}
	})
	t.Run("UnknownSession", func(t *testing.T) {
		covers(t, pb.ResponseStatus_UnknownSession)
		resp, err := rawCall(s.Addr, &pb.Request{Version: 2, Id: 3, Type: pb.RequestType_Lock, Session: 987654321,
			Lock: &pb.RequestLock{Keys: []string{"k"}, TryLock: true}}, limit)
		if err != nil || resp.Status != pb.ResponseStatus_UnknownSession || !strings.Contains(resp.ErrorText, "987654321") {
			t.Fatalf("%v %v", resp, err)
		}
		if !errors.Is(errorOf(pb.RequestType_Lock, resp), ErrConnectionLost) {
			t.Fatal("UnknownSession is not ErrConnectionLost")
		}
	})
	t.Run("ModeConflictAndLimitMismatch", func(t *testing.T) {
		covers(t, pb.ResponseStatus_ModeConflict, pb.ResponseStatus_LimitMismatch)
		own := connect(t, s.Addr, nil)
		if _, err := own.Lock(ctx, []string{"pool"}, &LockOptions{Try: true, Limit: 2}); err != nil {
			t.Fatal(err)
		}
		// The same owner asking in the other mode: a Lock of the Client
		// would go to an owner of its own (and find the key busy).
		_, err := own.l.call(ctx, pb.RequestType_Lock, &pb.RequestLock{Keys: []string{"pool"}, TryLock: true}, nil)
		serverErr(t, err, pb.ResponseStatus_ModeConflict)
		_, err = own.Lock(ctx, []string{"pool"}, &LockOptions{Try: true, Limit: 3})
		serverErr(t, err, pb.ResponseStatus_LimitMismatch)
		// A second holder of the semaphore on another connection.
		if _, err := connect(t, s.Addr, nil).Lock(ctx, []string{"pool"}, &LockOptions{Try: true, Limit: 2}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("QueuedAndUnknownTicket", func(t *testing.T) {
		covers(t, pb.ResponseStatus_Queued, pb.ResponseStatus_UnknownTicket)
		holder, waiter := connect(t, s.Addr, nil), connect(t, s.Addr, nil)
		held, err := holder.Lock(ctx, []string{"tq"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		l, q, err := waiter.Enqueue(ctx, []string{"tq"}, nil)
		if err != nil || l != nil || q == nil || q.Ticket == 0 || q.Place != 0 {
			t.Fatalf("enqueue: %v %v %v", l, q, err)
		}
		_, err = waiter.l.call(ctx, pb.RequestType_Wait, &pb.RequestLock{Ticket: 987654321}, nil)
		serverErr(t, err, pb.ResponseStatus_UnknownTicket)
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		got, err := q.Wait(ctx)
		if err != nil || got.Fence() <= held.Fence() {
			t.Fatalf("wait: %v", err)
		}
		// Free keys: granted at once.
		l, q, err = waiter.Enqueue(ctx, []string{"free"}, nil)
		if err != nil || l == nil || q != nil {
			t.Fatalf("enqueue of a free key: %v %v %v", l, q, err)
		}
	})
	t.Run("ValueTooLarge", func(t *testing.T) {
		covers(t, pb.ResponseStatus_ValueTooLarge)
		_, err := c.Lock(ctx, []string{"v"}, &LockOptions{Try: true, Value: make([]byte, 1025)})
		if se := serverErr(t, err, pb.ResponseStatus_ValueTooLarge); !strings.Contains(se.Text, "1024") {
			t.Fatal(err)
		}
	})
	t.Run("WatchLimit", func(t *testing.T) {
		covers(t, pb.ResponseStatus_WatchLimit)
		none := startServer(t, "", "--max-watchers", "0")
		_, err := connect(t, none.Addr, nil).Watch(ctx, "k", 0, nil, time.Millisecond)
		serverErr(t, err, pb.ResponseStatus_WatchLimit)
	})
	t.Run("FrameTooLargeFromTheServerAndRefusedByTheClient", func(t *testing.T) {
		covers(t, pb.ResponseStatus_FrameTooLarge)
		small := startServer(t, "", "--max-frame", "64")
		big := rawFrame(&pb.Request{Version: 2, Id: 5, Type: pb.RequestType_Lock, Lock: &pb.RequestLock{Keys: []string{strings.Repeat("k", 100)}}})
		out, err := rawExchange(small.Addr, [][]byte{rawFrame(&pb.Request{Version: 2, Id: 4, Type: pb.RequestType_Ping}), big}, 2, limit)
		if err != nil || out[1].Status != pb.ResponseStatus_FrameTooLarge || out[1].RequestId != 0 {
			t.Fatalf("%v %v", out, err)
		}
		sc := connect(t, small.Addr, nil)
		_, err = sc.Lock(ctx, []string{strings.Repeat("k", 100)}, nil)
		serverErr(t, err, pb.ResponseStatus_FrameTooLarge)
		if _, err := sc.Ping(ctx); err != nil {
			t.Fatalf("refused before sending, the connection lives: %v", err)
		}
	})
	t.Run("AccessDenied", func(t *testing.T) {
		covers(t, pb.ResponseStatus_AccessDenied)
		tokens := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(tokens, []byte("right\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		guarded := startServer(t, "", "--token-file", tokens)
		t.Setenv("DLOCK_TOKEN", "")
		for _, token := range []string{"", "wrong"} {
			_, err := Connect(ctx, guarded.Addr, &Options{Token: token})
			if !errors.Is(err, ErrAccessDenied) {
				t.Fatalf("token %q: %v", token, err)
			}
		}
		t.Setenv("DLOCK_TOKEN", "right")
		if _, err := connect(t, guarded.Addr, nil).Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("LimitReached", func(t *testing.T) {
		covers(t, pb.ResponseStatus_LimitReached)
		full := startServer(t, "", "--max-waiters", "1", "--max-connections", "4")
		a, b, cc := connect(t, full.Addr, nil), connect(t, full.Addr, nil), connect(t, full.Addr, nil)
		if _, err := a.Lock(ctx, []string{"k"}, nil); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { _, _ = b.Lock(wctx, []string{"k"}, nil) }()
		waitFor(t, "one waiter", func() bool {
			info, err := a.Inspect(ctx, []string{"k"})
			return err == nil && info[0].Waiters == 1
		})
		// (b's Lock waits on a fourth connection of its own; an Enqueue
		// stays on cc's.)
		_, _, err := cc.Enqueue(ctx, []string{"k"}, &LockOptions{Wait: 5 * time.Second})
		serverErr(t, err, pb.ResponseStatus_LimitReached)
		// A fifth connection is turned away with request_id 0.
		_, err = Connect(ctx, full.Addr, nil)
		var se *ServerError
		if !errors.As(err, &se) || se.Status != pb.ResponseStatus_LimitReached {
			t.Fatalf("a fifth connection: %v", err)
		}
	})
	t.Run("ShuttingDownAnswersAWaitingLock", func(t *testing.T) {
		covers(t, pb.ResponseStatus_ShuttingDown)
		stopping := startServer(t, "")
		a, b := connect(t, stopping.Addr, nil), connect(t, stopping.Addr, nil)
		if _, err := a.Lock(ctx, []string{"k"}, nil); err != nil {
			t.Fatal(err)
		}
		waiting := make(chan error, 1)
		go func() {
			_, err := b.Lock(ctx, []string{"k"}, nil)
			waiting <- err
		}()
		waitFor(t, "one waiter", func() bool {
			info, err := a.Inspect(ctx, []string{"k"})
			return err == nil && info[0].Waiters == 1
		})
		stopping.signal(syscall.SIGTERM)
		serverErr(t, <-waiting, pb.ResponseStatus_ShuttingDown)
	})
}

func TestUnavailableFromALeaderThatLostItsQuorumIsTyped(t *testing.T) {
	covers(t, pb.ResponseStatus_Unavailable)
	cl := startCluster(t, 3, "--session-ttl", "6s")
	lead := cl.leader(-1)
	// With both followers paused, the leader steps aside within twice the
	// election timeout: it resets the connections of named sessions (a
	// Lock it cannot commit is no longer answered Unavailable) and answers
	// the session-less Ping of a client's probe Unavailable.
	probe := func() *pb.Response {
		resp, err := rawCall(cl.Addrs[lead], &pb.Request{Version: 2, Id: 1, Type: pb.RequestType_Ping}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := probe(); resp.Status != pb.ResponseStatus_Ok {
		t.Fatalf("the leader answers its probe %v", resp)
	}
	for i := range cl.nodes {
		if i != lead {
			cl.pause(i)
		}
	}
	defer func() {
		for i := range cl.nodes {
			cl.resume(i)
		}
	}()
	var resp *pb.Response
	waitFor(t, "the leader without a quorum answers its probe Unavailable", func() bool {
		resp = probe()
		if resp.Status != pb.ResponseStatus_Ok && resp.Status != pb.ResponseStatus_Unavailable {
			t.Fatalf("the probe: %v", resp)
		}
		return resp.Status == pb.ResponseStatus_Unavailable
	})
	if !errors.Is(errorOf(pb.RequestType_Ping, resp), ErrUnavailable) {
		t.Fatal("Unavailable is not ErrUnavailable")
	}
}

func TestEveryStatusOfTheProtoHasATest(t *testing.T) {
	// Runs last (go test runs tests in file order, this file after the
	// cluster tests that cover NotLeader).
	for v, name := range pb.ResponseStatus_name {
		if !covered[pb.ResponseStatus(v)] && !testing.Short() && !filtered() {
			t.Errorf("status %s is provoked by no test that passed", name)
		}
	}
}

// filtered: -run picked some tests, so the others' statuses are not seen.
func filtered() bool {
	f := flag.Lookup("test.run")
	return f != nil && f.Value.String() != ""
}
