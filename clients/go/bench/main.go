// Command bench measures lock+unlock cycles per second of the Go client
// against a running dlock-server, beside the Python client's
// clients/python/bench:
//
//	go run ./bench -server 127.0.0.1:7436 [-goroutines 32] [-seconds 5] [-rounds 3]
//
// Workloads, each for -seconds, rounds alternating so that a drift of the
// shared machine hits all alike (the median round is reported):
//
//   - one-conn: -goroutines goroutines on ONE Client (one connection,
//     requests pipelined), each on a key of its own (locks belong to the
//     connection: goroutines sharing one and a key would not exclude each
//     other), in a loop of Lock then Unlock;
//   - n-conns: the same with a Client per goroutine;
//   - ping-1: one goroutine's sequential Pings on one connection (a round
//     trip each): the reference, measured in the same run.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	dlock "dlock/clients/go"
)

func main() {
	server := flag.String("server", "", "server address (default: DLOCK_SERVER, else 127.0.0.1:7436)")
	goroutines := flag.Int("goroutines", 32, "concurrent goroutines")
	seconds := flag.Float64("seconds", 5, "seconds per workload and round")
	rounds := flag.Int("rounds", 3, "rounds")
	flag.Parse()
	ctx := context.Background()
	d := time.Duration(*seconds * float64(time.Second))
	names := []string{"one-conn", "n-conns", "ping-1"}
	runs := map[string][]float64{}
	for r := 0; r < *rounds; r++ {
		for _, name := range names {
			rate, err := measure(ctx, name, *server, *goroutines, d)
			if err != nil {
				log.Fatalf("%s: %v", name, err)
			}
			runs[name] = append(runs[name], rate)
		}
	}
	host, _ := os.Hostname()
	fmt.Printf("%d goroutines, %v x %d rounds on %s; median round; all rounds in ops/s\n", *goroutines, d, *rounds, host)
	for _, name := range names {
		rs := append([]float64(nil), runs[name]...)
		sort.Float64s(rs)
		fmt.Printf("%-9s %10.0f   %v\n", name, rs[len(rs)/2], rounded(runs[name]))
	}
}

func rounded(xs []float64) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x + 0.5)
	}
	return out
}

// measure runs one workload: warm-up, then d; returns operations per second.
func measure(ctx context.Context, name, server string, n int, d time.Duration) (float64, error) {
	clients := 1
	if name == "n-conns" {
		clients = n
	}
	var cs []*dlock.Client
	for i := 0; i < clients; i++ {
		c, err := dlock.Connect(ctx, server, nil)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		cs = append(cs, c)
	}
	var op func(g int) error
	workers := n
	if name == "ping-1" {
		workers = 1
		op = func(int) error { _, err := cs[0].Ping(ctx); return err }
	} else {
		op = func(g int) error {
			l, err := cs[g%len(cs)].Lock(ctx, []string{fmt.Sprintf("bench/%d", g)}, nil)
			if err != nil {
				return err
			}
			return l.Unlock(ctx)
		}
	}
	if _, err := drive(op, workers, 300*time.Millisecond); err != nil {
		return 0, err
	}
	start := time.Now()
	done, err := drive(op, workers, d)
	return float64(done) / time.Since(start).Seconds(), err
}

// drive runs op in workers goroutines for d; returns how many were done.
func drive(op func(g int) error, workers int, d time.Duration) (int64, error) {
	var done int64
	var first error
	var once sync.Once
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for time.Now().Before(stop) {
				if err := op(g); err != nil {
					once.Do(func() { first = err })
					return
				}
				atomic.AddInt64(&done, 1)
			}
		}(g)
	}
	wg.Wait()
	return done, first
}
