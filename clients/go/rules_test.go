package dlock

// The shared rule vectors (clients/conformance/rules.json, written by the
// Rust library's tests/rule_vectors.rs from src/rules.rs) run against
// rules.go: a rule changed in one client and not in the others fails here.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	pb "dlock/clients/go/dlockpb"
)

// ruleVectors is rules.json. Times and durations are in microseconds;
// kinds and statuses by their names in proto/dlock.proto.
type ruleVectors struct {
	ClockRateBound *float64 `json:"clock_rate_bound"`
	Deadline       []struct {
		Sent     int64 `json:"sent_us"`
		Window   int64 `json:"window_us"`
		Deadline int64 `json:"deadline_us"`
	} `json:"deadline"`
	Margin []struct {
		Configured int64 `json:"configured_us"`
		Window     int64 `json:"window_us"`
		Margin     int64 `json:"margin_us"`
	} `json:"margin"`
	InJeopardy []struct {
		Now      int64 `json:"now_us"`
		Deadline int64 `json:"deadline_us"`
		Margin   int64 `json:"margin_us"`
		Jeopardy bool  `json:"jeopardy"`
	} `json:"in_jeopardy"`
	MovesDeadline []struct {
		OnSession     bool   `json:"on_session"`
		Kind          string `json:"kind"`
		Status        string `json:"status"`
		MovesDeadline bool   `json:"moves_deadline"`
	} `json:"moves_deadline"`
	Elsewhere []struct {
		Status  string  `json:"status"`
		Leader  *string `json:"leader"`
		Means   *string `json:"means"`
		MovesTo *string `json:"moves_to"`
	} `json:"elsewhere"`
	Kinds []struct {
		Kind           string `json:"kind"`
		ActsForSession bool   `json:"acts_for_session"`
		Numbered       bool   `json:"numbered"`
		MayWait        bool   `json:"may_wait"`
	} `json:"kinds"`
	UnansweredTooLong []struct {
		Kind    string `json:"kind"`
		Waited  int64  `json:"waited_us"`
		TTL     int64  `json:"ttl_us"`
		TooLong bool   `json:"too_long"`
	} `json:"unanswered_too_long"`
	SessionLivesUntil []struct {
		Acked int64 `json:"acked_us"`
		Broke int64 `json:"broke_us"`
		TTL   int64 `json:"ttl_us"`
		Until int64 `json:"until_us"`
	} `json:"session_lives_until"`
	Holds []struct {
		Name    string `json:"name"`
		Granted struct {
			Sent  int64  `json:"sent_us"`
			Lease *int64 `json:"lease_us"`
		} `json:"granted"`
		Steps []struct {
			RenewSent     *renewalVector `json:"renew_sent"`
			RenewAnswered *renewalVector `json:"renew_answered"`
		} `json:"steps"`
		OwnerAcked   int64  `json:"owner_acked_us"`
		OwnerTimeout int64  `json:"owner_timeout_us"`
		Deadline     int64  `json:"deadline_us"`
		Lease        *int64 `json:"lease_us"`
		Window       int64  `json:"window_us"`
		Renewal      *struct {
			At    int64 `json:"at_ns"`
			Lease int64 `json:"lease_us"`
		} `json:"renewal"`
	} `json:"holds"`
	// A null election timeout: the node states none (0 in this client,
	// as the wire's 0 reads).
	SilenceLimits []struct {
		ElectionTimeout *uint64 `json:"election_timeout_us"`
		TTL             uint64  `json:"ttl_us"`
		Limit           int64   `json:"limit_us"`
	} `json:"silence_limits"`
	GoneSilent []struct {
		LastHeard int64 `json:"last_heard_us"`
		Now       int64 `json:"now_us"`
		Limit     int64 `json:"limit_us"`
		Gone      bool  `json:"gone"`
	} `json:"gone_silent"`
}

type renewalVector struct {
	Sent  int64 `json:"sent_us"`
	Lease int64 `json:"lease_us"`
}

// rulesFile finds clients/conformance/rules.json above this package's
// directory, whether it is reached through a symlink (ci.sh links it into
// a GOPATH of its own) or not.
func rulesFile(t *testing.T) string {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, start := range starts {
		dir, err := filepath.EvalSymlinks(start)
		if err != nil {
			continue
		}
		for {
			path := filepath.Join(dir, "clients", "conformance", "rules.json")
			if _, err := os.Stat(path); err == nil {
				return path
			}
			up := filepath.Dir(dir)
			if up == dir {
				break
			}
			dir = up
		}
	}
	t.Fatalf("clients/conformance/rules.json not found above %q", starts)
	return ""
}

func loadRuleVectors(t *testing.T) *ruleVectors {
	path := rulesFile(t)
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v ruleVectors
	if err := json.Unmarshal(text, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &v
}

// vectorEpoch is the instant the vectors' times count from.
var vectorEpoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

func at(n int64) time.Time { return vectorEpoch.Add(us(n)) }

// sinceEpoch is t in whole microseconds after vectorEpoch, as Rust's
// Duration::as_micros counts (rounding down).
func sinceEpoch(t time.Time) int64 { return int64(t.Sub(vectorEpoch) / time.Microsecond) }

func kindNamed(t *testing.T, section string, i int, name string) pb.RequestType {
	k, ok := pb.RequestType_value[name]
	if !ok {
		t.Fatalf("%s case %d: request kind %q unknown to dlockpb", section, i, name)
	}
	return pb.RequestType(k)
}

func statusNamed(t *testing.T, section string, i int, name string) pb.ResponseStatus {
	s, ok := pb.ResponseStatus_value[name]
	if !ok {
		t.Fatalf("%s case %d: status %q unknown to dlockpb", section, i, name)
	}
	return pb.ResponseStatus(s)
}

func orNull(s *string) string {
	if s == nil {
		return "null"
	}
	return fmt.Sprintf("%q", *s)
}

func TestRuleVectors(t *testing.T) {
	v := loadRuleVectors(t)
	sizes := map[string]int{
		"deadline": len(v.Deadline), "margin": len(v.Margin), "in_jeopardy": len(v.InJeopardy),
		"moves_deadline": len(v.MovesDeadline), "elsewhere": len(v.Elsewhere), "kinds": len(v.Kinds),
		"unanswered_too_long": len(v.UnansweredTooLong), "session_lives_until": len(v.SessionLivesUntil),
		"holds": len(v.Holds), "silence_limits": len(v.SilenceLimits), "gone_silent": len(v.GoneSilent),
	}
	for section, n := range sizes {
		if n == 0 {
			t.Errorf("section %s: no vectors", section)
		}
	}
	if v.ClockRateBound == nil || *v.ClockRateBound != ClockRateBound {
		t.Errorf("clock_rate_bound: the vectors' %v, ClockRateBound %v", v.ClockRateBound, ClockRateBound)
	}

	t.Run("deadline", func(t *testing.T) {
		for i, c := range v.Deadline {
			if got := sinceEpoch(deadline(at(c.Sent), us(c.Window))); got != c.Deadline {
				t.Errorf("deadline case %d (sent %d µs, window %d µs): %d µs, want %d", i, c.Sent, c.Window, got, c.Deadline)
			}
		}
	})
	t.Run("margin", func(t *testing.T) {
		for i, c := range v.Margin {
			if got := int64(margin(us(c.Configured), us(c.Window)) / time.Microsecond); got != c.Margin {
				t.Errorf("margin case %d (configured %d µs, window %d µs): %d µs, want %d", i, c.Configured, c.Window, got, c.Margin)
			}
		}
	})
	t.Run("in_jeopardy", func(t *testing.T) {
		for i, c := range v.InJeopardy {
			if got := inJeopardy(at(c.Now), at(c.Deadline), us(c.Margin)); got != c.Jeopardy {
				t.Errorf("in_jeopardy case %d (now %d µs, deadline %d µs, margin %d µs): %v, want %v", i, c.Now, c.Deadline, c.Margin, got, c.Jeopardy)
			}
		}
	})
	t.Run("moves_deadline", func(t *testing.T) {
		for i, c := range v.MovesDeadline {
			kind, status := kindNamed(t, "moves_deadline", i, c.Kind), statusNamed(t, "moves_deadline", i, c.Status)
			if got := movesDeadline(c.OnSession, kind, status); got != c.MovesDeadline {
				t.Errorf("moves_deadline case %d (on_session %v, %s answered %s): %v, want %v", i, c.OnSession, c.Kind, c.Status, got, c.MovesDeadline)
			}
		}
	})
	t.Run("elsewhere", func(t *testing.T) {
		names := map[disconnect]string{sessionEnded: "session_ended", notLeader: "not_leader", noQuorum: "no_quorum"}
		for i, c := range v.Elsewhere {
			status := statusNamed(t, "elsewhere", i, c.Status)
			leader := ""
			if c.Leader != nil {
				leader = *c.Leader
			}
			why, to := elsewhere(status, leader)
			var means, movesTo *string
			if why != stayHere {
				name := names[why]
				means = &name
			}
			if why == notLeader && to != "" {
				movesTo = &to
			}
			if orNull(means) != orNull(c.Means) || orNull(movesTo) != orNull(c.MovesTo) {
				t.Errorf("elsewhere case %d (%s, leader %s): means %s moving to %s, want %s moving to %s",
					i, c.Status, orNull(c.Leader), orNull(means), orNull(movesTo), orNull(c.Means), orNull(c.MovesTo))
			}
		}
	})
	t.Run("kinds", func(t *testing.T) {
		seen := map[pb.RequestType]bool{}
		for i, c := range v.Kinds {
			kind := kindNamed(t, "kinds", i, c.Kind)
			seen[kind] = true
			acts, numbered := sessionUse(kind)
			if acts != c.ActsForSession || numbered != c.Numbered || mayWait(kind) != c.MayWait {
				t.Errorf("kinds case %d (%s): acts_for_session %v, numbered %v, may_wait %v; want %v, %v, %v",
					i, c.Kind, acts, numbered, mayWait(kind), c.ActsForSession, c.Numbered, c.MayWait)
			}
		}
		for n, name := range pb.RequestType_name {
			if !seen[pb.RequestType(n)] {
				t.Errorf("kinds: no vector for %s", name)
			}
		}
	})
	t.Run("unanswered_too_long", func(t *testing.T) {
		for i, c := range v.UnansweredTooLong {
			kind := kindNamed(t, "unanswered_too_long", i, c.Kind)
			if got := unansweredTooLong(kind, us(c.Waited), us(c.TTL)); got != c.TooLong {
				t.Errorf("unanswered_too_long case %d (%s waited %d µs, TTL %d µs): %v, want %v", i, c.Kind, c.Waited, c.TTL, got, c.TooLong)
			}
		}
	})
	t.Run("session_lives_until", func(t *testing.T) {
		for i, c := range v.SessionLivesUntil {
			if got := sinceEpoch(sessionLivesUntil(at(c.Acked), at(c.Broke), us(c.TTL))); got != c.Until {
				t.Errorf("session_lives_until case %d (acked %d µs, broke %d µs, TTL %d µs): %d µs, want %d", i, c.Acked, c.Broke, c.TTL, got, c.Until)
			}
		}
	})
	t.Run("holds", func(t *testing.T) {
		for i, c := range v.Holds {
			var lease time.Duration
			if c.Granted.Lease != nil {
				lease = us(*c.Granted.Lease)
			}
			h := granted(at(c.Granted.Sent), lease)
			for j, s := range c.Steps {
				switch {
				case s.RenewSent != nil && s.RenewAnswered == nil:
					h.renewSent(at(s.RenewSent.Sent), us(s.RenewSent.Lease))
				case s.RenewAnswered != nil && s.RenewSent == nil:
					h.renewAnswered(at(s.RenewAnswered.Sent), us(s.RenewAnswered.Lease))
				default:
					t.Fatalf("holds case %d (%s): step %d is neither renew_sent nor renew_answered", i, c.Name, j)
				}
			}
			timeout := us(c.OwnerTimeout)
			gotDeadline := sinceEpoch(h.deadline(at(c.OwnerAcked), timeout))
			gotWindow := int64(h.window(timeout) / time.Microsecond)
			var gotLease *int64
			if h.lease != nil {
				l := int64(h.lease.lease / time.Microsecond)
				gotLease = &l
			}
			show := func(p *int64) string {
				if p == nil {
					return "null"
				}
				return fmt.Sprint(*p)
			}
			if gotDeadline != c.Deadline || gotWindow != c.Window || show(gotLease) != show(c.Lease) {
				t.Errorf("holds case %d (%s): deadline %d µs, lease %s, window %d µs; want %d, %s, %d",
					i, c.Name, gotDeadline, show(gotLease), gotWindow, c.Deadline, show(c.Lease), c.Window)
			}
			renewAt, renewLease, renews := h.renewal()
			want := "none"
			if c.Renewal != nil {
				want = fmt.Sprintf("at %d ns to %d µs", c.Renewal.At, c.Renewal.Lease)
			}
			got := "none"
			if renews {
				got = fmt.Sprintf("at %d ns to %d µs", renewAt.Sub(vectorEpoch).Nanoseconds(), renewLease/time.Microsecond)
			}
			if got != want {
				t.Errorf("holds case %d (%s): renewal %s, want %s", i, c.Name, got, want)
			}
		}
	})
	t.Run("silence_limits", func(t *testing.T) {
		for i, c := range v.SilenceLimits {
			// As the node's word reaches silenceLimit: through the
			// wire's decoding (micros), 0 for none.
			var election time.Duration
			stated := "none"
			if c.ElectionTimeout != nil {
				election = micros(*c.ElectionTimeout)
				stated = fmt.Sprintf("%d µs", *c.ElectionTimeout)
			}
			if got := int64(silenceLimit(election, micros(c.TTL)) / time.Microsecond); got != c.Limit {
				t.Errorf("silence_limits case %d (election timeout %s, TTL %d µs): %d µs, want %d", i, stated, c.TTL, got, c.Limit)
			}
		}
	})
	t.Run("gone_silent", func(t *testing.T) {
		for i, c := range v.GoneSilent {
			if got := goneSilent(us(c.LastHeard), us(c.Now), us(c.Limit)); got != c.Gone {
				t.Errorf("gone_silent case %d (last heard %d µs, now %d µs, limit %d µs): %v, want %v", i, c.LastHeard, c.Now, c.Limit, got, c.Gone)
			}
		}
	})
}

// The hole the vectors' holds close: a Renew of a lock without a lease
// whose answer never comes may have made it a short lease at the server;
// the client used to go on believing in the session. Now the renewal's
// lease bounds the deadline, and the lock is reported lost by it.
func TestAnUnansweredRenewalBoundsALockWithoutALease(t *testing.T) {
	renewing := make(chan struct{}, 1)
	release := make(chan struct{})
	opens := fakeLeader(1)
	node := startFake(t, func(fc *fakeConn, req *pb.Request) *pb.Response {
		switch req.Type {
		case pb.RequestType_Lock:
			return &pb.Response{Status: pb.ResponseStatus_Ok, Fence: 7}
		case pb.RequestType_Renew:
			// Applied, say, but the answer is held up.
			renewing <- struct{}{}
			<-release
		}
		return opens(fc, req)
	})
	c := connect(t, node.Addr, nil)
	t.Cleanup(func() { close(release) })
	ctx := testCtx(t)
	l, err := c.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Lease() != 0 {
		t.Fatalf("lease %v, want none", l.Lease())
	}
	if left := time.Until(l.Deadline()); left < fakeTTL/2 {
		t.Fatalf("bound to a session of %v, the deadline is %v away", fakeTTL, left)
	}
	const lease = time.Second
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	sent := time.Now()
	go func() { done <- l.Renew(rctx, lease) }()
	select {
	case <-renewing:
	case <-time.After(limit):
		t.Fatal("the Renew never reached the node")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Renew given up: %v", err)
	}
	if l.Lease() != 0 {
		t.Fatalf("lease %v: an unanswered renewal is not known to be in force", l.Lease())
	}
	if d := l.Deadline(); d.After(sent.Add(lease)) || d.Before(sent) {
		t.Fatalf("deadline %v after the Renew was sent, want within its lease of %v", d.Sub(sent), lease)
	}
	select {
	case <-l.Lost():
	case <-time.After(fakeTTL / 2):
		t.Fatal("not reported lost by the unanswered renewal's lease")
	}
	var lost *LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != LostDeadline || !strings.Contains(lost.Text, "got no answer") {
		t.Fatalf("lost: %v", l.Err())
	}
}

// The vectors' times are small; the link's silence limit is the node's
// word (through silenceLimit), so a sum past the end of time must read as
// a silence that never comes, not wrap round into one that came long ago.
func TestGoneSilentSaturatesInsteadOfWrapping(t *testing.T) {
	const end = time.Duration(math.MaxInt64)
	if goneSilent(time.Second, 2*time.Second, end) {
		t.Error("a limit to the end of time ran out after a second")
	}
	if !goneSilent(0, end, end) {
		t.Error("a limit to the end of time did not run out at its end")
	}
}
