package dlock

// The ownership rule: every Lock has an owner of its own, so goroutines
// sharing one Client that lock the same key take turns with each other and
// with any other process, as tests/owners.rs checks for the Rust library.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// otherOwnerEnv makes the test binary the other owner of the turns tests
// (TestMain): "KEY ROUNDS", with DLOCK_SERVER naming the servers.
const otherOwnerEnv = "DLOCK_GO_TEST_OTHER_OWNER"

// turn is how long each turn keeps the key: long enough that two holders
// at once would meet, short enough for many turns.
const turn = 2 * time.Millisecond

// otherOwner takes KEY ROUNDS times on a Client of its own (another
// process: another owner by any measure). Around each hold it writes
// "enter FENCE" and "leave FENCE" and waits for a line on stdin before
// going on, so the test sees the hold as an interval inside the real one.
// It writes "done" at the end, or "error TEXT" and returns 1.
func otherOwner(spec string) int {
	fail := func(err error) int {
		fmt.Printf("error %v\n", err)
		return 1
	}
	f := strings.Fields(spec)
	if len(f) != 2 {
		return fail(fmt.Errorf("%s=%q is not KEY ROUNDS", otherOwnerEnv, spec))
	}
	rounds, err := strconv.Atoi(f[1])
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c, err := Connect(ctx, "", nil)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	in := bufio.NewReader(os.Stdin)
	for i := 0; i < rounds; i++ {
		l, err := c.Lock(ctx, []string{f[0]}, nil)
		if err != nil {
			return fail(err)
		}
		fmt.Printf("enter %d\n", l.Fence())
		if _, err := in.ReadString('\n'); err != nil {
			return fail(err)
		}
		time.Sleep(turn)
		if err := l.Check(); err != nil {
			return fail(err)
		}
		fmt.Printf("leave %d\n", l.Fence())
		if _, err := in.ReadString('\n'); err != nil {
			return fail(err)
		}
		if err := l.Unlock(ctx); err != nil {
			return fail(err)
		}
	}
	fmt.Println("done")
	return 0
}

// turns is the record of who held the key, checked as it is written.
type turns struct {
	inside int32 // holders at this moment: never more than one
	mu     sync.Mutex
	holder string
	fence  uint64
	holds  map[string]int
	errs   []string
	more   int
}

func (tr *turns) failf(format string, args ...interface{}) {
	// tr.mu is held. The first few failures tell the story.
	if len(tr.errs) < 10 {
		tr.errs = append(tr.errs, fmt.Sprintf(format, args...))
	} else {
		tr.more++
	}
}

func (tr *turns) enter(who string, fence uint64) {
	overlap := atomic.AddInt32(&tr.inside, 1) != 1
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if overlap {
		tr.failf("%s entered under fence %d while %s held the key under fence %d", who, fence, tr.holder, tr.fence)
	} else if fence <= tr.fence {
		tr.failf("%s was granted fence %d after fence %d: fences must rise in grant order", who, fence, tr.fence)
	}
	tr.holder, tr.fence = who, fence
	tr.holds[who]++
}

func (tr *turns) leave() {
	atomic.AddInt32(&tr.inside, -1)
}

func (tr *turns) fail(err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.failf("%v", err)
}

// checkTurns has workers goroutines share one Client and lock one key
// rounds times each while another process does the same, and checks that
// no two of them ever hold it at once and that fences rise in grant order.
func checkTurns(t *testing.T, servers string, workers, rounds int) {
	ctx := testCtx(t)
	key := "owners/turns"
	c := connect(t, servers, nil)
	tr := &turns{holds: map[string]int{}}

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d", otherOwnerEnv, key, rounds), "DLOCK_SERVER="+servers)
	cmd.Stderr = os.Stderr
	toOther, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	fromOther, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	otherDone := make(chan string, 1)
	go func() {
		// The other process's holds enter the same record as the
		// goroutines': it waits for the answer to each line.
		sc := bufio.NewScanner(fromOther)
		last := "its output ended"
		for sc.Scan() {
			word, arg, _ := strings.Cut(sc.Text(), " ")
			switch word {
			case "enter":
				fence, _ := strconv.ParseUint(arg, 10, 64)
				tr.enter("the other process", fence)
			case "leave":
				tr.leave()
			default:
				last = sc.Text()
				continue
			}
			if _, err := io.WriteString(toOther, "\n"); err != nil {
				last = err.Error()
				break
			}
		}
		otherDone <- last
	}()

	start := time.Now()
	var wg sync.WaitGroup
	for w := 1; w <= workers; w++ {
		who := fmt.Sprintf("goroutine %d", w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				l, err := c.Lock(ctx, []string{key}, nil)
				if err != nil {
					tr.fail(fmt.Errorf("%s: %w", who, err))
					return
				}
				tr.enter(who, l.Fence())
				time.Sleep(turn)
				err = l.Check()
				tr.leave()
				if err != nil {
					tr.fail(fmt.Errorf("%s, fence %d: %w", who, l.Fence(), err))
				}
				if err := l.Unlock(ctx); err != nil {
					tr.fail(fmt.Errorf("%s, unlock of fence %d: %w", who, l.Fence(), err))
					return
				}
			}
		}()
	}
	wg.Wait()
	// Every claim ends with its Lock: none is left behind to send later
	// Locks of the key aside for nothing.
	waitFor(t, "no key claimed", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.claims) == 0
	})
	var last string
	select {
	case last = <-otherDone:
	case <-ctx.Done():
		t.Fatalf("the other process did not finish within %v", limit)
	}
	if err := cmd.Wait(); err != nil || last != "done" {
		tr.fail(fmt.Errorf("the other process: %q, %v", last, err))
	}
	t.Logf("%d turns in %v", tr.holds["the other process"]+workers*rounds, time.Since(start).Round(time.Millisecond))
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for w := 1; w <= workers; w++ {
		if n := tr.holds[fmt.Sprintf("goroutine %d", w)]; n != rounds {
			tr.failf("goroutine %d held the key %d times, not %d", w, n, rounds)
		}
	}
	if n := tr.holds["the other process"]; n != rounds {
		tr.failf("the other process held the key %d times, not %d", n, rounds)
	}
	if len(tr.errs) > 0 {
		t.Fatalf("%s (and %d more)", strings.Join(tr.errs, "\n"), tr.more)
	}
}

func TestGoroutinesSharingAClientTakeTurnsWithEachOtherAndAnotherProcess(t *testing.T) {
	s := startServer(t, "")
	checkTurns(t, s.Addr, 4, 25)
}

func TestGoroutinesSharingAClientTakeTurnsOnACluster(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3, "--session-ttl", "6s")
	cl.leader(-1)
	checkTurns(t, cl.Servers(), 4, 25)
}

// A key a Lock of this Client holds is not granted to the Client again: a
// Try reports it busy, a Lock waits in line until it is unlocked, and the
// first Lock is never reported lost.
func TestASecondLockOfTheSameClientOnAHeldKeyWaitsAndATryFindsItBusy(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	c, observer := connect(t, s.Addr, nil), connect(t, s.Addr, nil)
	first, err := c.Lock(ctx, []string{"k"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lock(ctx, []string{"k"}, &LockOptions{Try: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("a Try on a key the Client holds: %v, want ErrBusy", err)
	}
	got := make(chan *Lock, 1)
	go func() {
		l, err := c.Lock(ctx, []string{"k"}, nil)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, "the second Lock in line", func() bool {
		info, err := observer.Inspect(ctx, []string{"k"})
		return err == nil && info[0].Waiters == 1 && info[0].First().Fence == first.Fence()
	})
	if err := first.Check(); err != nil {
		t.Fatalf("the first Lock: %v", err)
	}
	select {
	case <-got:
		t.Fatal("granted while the first Lock held the key")
	default:
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if second == nil {
		t.FailNow()
	}
	if second.Fence() <= first.Fence() || first.Err() != nil {
		t.Fatalf("second fence %d after %d; first %v", second.Fence(), first.Fence(), first.Err())
	}
	if err := second.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Shared locks of one Client are holders of their own: a semaphore counts
// each, and an exclusive Lock of the same Client waits for them instead of
// being refused with ModeConflict.
func TestSharedLocksOfOneClientAreHoldersOfTheirOwn(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	c, observer := connect(t, s.Addr, nil), connect(t, s.Addr, nil)
	sem := &LockOptions{Limit: 2}
	a, err := c.Lock(ctx, []string{"pool"}, sem)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Lock(ctx, []string{"pool"}, sem)
	if err != nil {
		t.Fatal(err)
	}
	info, err := observer.Inspect(ctx, []string{"pool"})
	if err != nil || len(info[0].Holders) != 2 {
		t.Fatalf("two holders of the semaphore: %+v %v", info, err)
	}
	if _, err := c.Lock(ctx, []string{"pool"}, &LockOptions{Limit: 2, Try: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("a third holder of a semaphore of two: %v, want ErrBusy", err)
	}
	got := make(chan *Lock, 1)
	go func() {
		l, err := c.Lock(ctx, []string{"pool"}, nil)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, "the exclusive Lock in line", func() bool {
		info, err := observer.Inspect(ctx, []string{"pool"})
		return err == nil && info[0].Waiters == 1
	})
	for _, l := range []*Lock{a, b} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	x := <-got
	if x == nil {
		t.FailNow()
	}
	if err := x.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Err() != nil || b.Err() != nil {
		t.Fatalf("lost: %v %v", a.Err(), b.Err())
	}
}

// An Enqueue of a key this Client holds waits in line on a connection of
// its own, as a Lock does, and a Lock of a key the Client's Enqueue waits
// for waits behind it.
func TestAnEnqueueOfAKeyTheClientHoldsWaitsItsTurn(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	c, observer := connect(t, s.Addr, nil), connect(t, s.Addr, nil)
	first, err := c.Lock(ctx, []string{"q"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, q, err := c.Enqueue(ctx, []string{"q"}, nil)
	if err != nil || l != nil || q == nil {
		if l != nil {
			t.Fatalf("an Enqueue of a held key was granted at once, fence %d after %d", l.Fence(), first.Fence())
		}
		t.Fatalf("enqueue of a held key: %v", err)
	}
	got := make(chan *Lock, 1)
	go func() {
		l, err := c.Lock(ctx, []string{"q"}, nil)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, "the Enqueue and the Lock in line", func() bool {
		info, err := observer.Inspect(ctx, []string{"q"})
		return err == nil && info[0].Waiters == 2
	})
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	queued, err := q.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if queued.Fence() <= first.Fence() {
		t.Fatalf("fence %d after %d", queued.Fence(), first.Fence())
	}
	select {
	case <-got:
		t.Fatal("the Lock was granted while the Enqueue's grant held the key")
	default:
	}
	if err := queued.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	last := <-got
	if last == nil {
		t.FailNow()
	}
	if last.Fence() <= queued.Fence() || first.Err() != nil || queued.Err() != nil {
		t.Fatalf("fence %d after %d; %v %v", last.Fence(), queued.Fence(), first.Err(), queued.Err())
	}
	_ = last.Unlock(ctx)
}

// An Unlock whose ctx has ended still releases the key, whether the Lock
// was taken on the Client's connection or on one of its own: it is never
// left held there unseen.
func TestAnUnlockWithAnEndedContextStillReleasesTheKey(t *testing.T) {
	s := startServer(t, "")
	ctx := testCtx(t)
	c, other := connect(t, s.Addr, nil), connect(t, s.Addr, nil)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	first, err := c.Lock(ctx, []string{"u"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lock, 1)
	go func() {
		// Waits on a connection of its own.
		l, err := c.Lock(ctx, []string{"u"}, nil)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, "the second Lock in line", func() bool {
		info, err := other.Inspect(ctx, []string{"u"})
		return err == nil && info[0].Waiters == 1
	})
	for i := 0; i < 2; i++ {
		_ = first.Unlock(ended)
		if i == 0 {
			if first = <-got; first == nil {
				t.FailNow()
			}
		}
	}
	waitFor(t, "the key free", func() bool {
		info, err := other.Inspect(ctx, []string{"u"})
		return err == nil && len(info[0].Holders) == 0
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.claims) != 0 {
		t.Fatalf("claims left: %v", c.claims)
	}
}
