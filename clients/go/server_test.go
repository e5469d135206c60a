package dlock

// Real dlock-server processes for the tests: single servers on 127.0.0.1:0
// (the port read from the server's "listening" log line, so none is
// guessed) and clusters on ports reserved below the ephemeral range (a
// node must know its peers' addresses before it starts). The binary is
// DLOCK_SERVER_BIN, else target/debug/dlock-server of this checkout.

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "dlock/clients/go/dlockpb"

	"google.golang.org/protobuf/proto"
)

// limit bounds anything a test waits for: a hang fails the test, not CI.
const limit = 30 * time.Second

func serverBin(t testing.TB) string {
	bin := serverPath()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("dlock-server not found at %s: build it with `cargo build -p dlock-server` or set DLOCK_SERVER_BIN", bin)
	}
	return bin
}

func serverPath() string {
	bin := os.Getenv("DLOCK_SERVER_BIN")
	if bin == "" {
		target := os.Getenv("CARGO_TARGET_DIR")
		if target == "" {
			wd, _ := os.Getwd()
			target = filepath.Join(wd, "..", "..", "target")
		}
		bin = filepath.Join(target, "debug", "dlock-server")
	}
	return bin
}

// testServer is one dlock-server process.
type testServer struct {
	Addr string
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  []string
	exit chan struct{}
}

var listening = regexp.MustCompile(`listening addr=(\S+)`)

// startServer starts a server with flags on listen ("" → 127.0.0.1:0)
// and waits until it says where it listens; t's cleanup kills it.
func startServer(t testing.TB, listen string, flags ...string) *testServer {
	t.Helper()
	s, err := launch(serverBin(t), listen, flags...)
	if s != nil {
		t.Cleanup(s.kill)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func launch(bin, listen string, flags ...string) (*testServer, error) {
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	args := append([]string{"--listen", listen, "--log-level", "info"}, flags...)
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting dlock-server: %w", err)
	}
	s := &testServer{cmd: cmd, exit: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		// Drains stderr for the server's whole life, so a chatty server
		// never blocks on a full pipe.
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			if len(s.log) < 2000 {
				s.log = append(s.log, line)
			}
			s.mu.Unlock()
			if m := listening.FindStringSubmatch(line); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		_ = cmd.Wait()
		close(s.exit)
	}()
	select {
	case s.Addr = <-addr:
		return s, nil
	case <-s.exit:
		return s, fmt.Errorf("dlock-server exited before listening: %s", s.logText())
	case <-time.After(10 * time.Second):
		s.kill()
		return s, fmt.Errorf("dlock-server did not say where it listens within 10 s: %s", s.logText())
	}
}

func (s *testServer) logText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.log, "\n")
}

// signal sends sig; after SIGSTOP it returns once every thread of the
// server has stopped, for kill(2) returns before that, and on a busy
// machine a thread already running could still answer a request sent just
// after.
func (s *testServer) signal(sig syscall.Signal) {
	_ = s.cmd.Process.Signal(sig)
	if sig != syscall.SIGSTOP {
		return
	}
	deadline := time.Now().Add(limit)
	for !allThreadsStopped(s.cmd.Process.Pid) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// allThreadsStopped reports whether every thread of pid is stopped (T in
// /proc/PID/task/TID/stat); one that has exited (Z, X, gone) counts too,
// for the test's next step reports that.
func allThreadsStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return true
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue
		}
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		fields := strings.Fields(rest)
		if len(fields) > 0 && !strings.Contains("TtZX", fields[0]) {
			return false
		}
	}
	return true
}

func (s *testServer) kill() {
	s.signal(syscall.SIGCONT)
	_ = s.cmd.Process.Kill()
	select {
	case <-s.exit:
	case <-time.After(limit):
	}
}

// reservePort is a listening socket on a free loopback port below the
// ephemeral range: held until its node is about to bind it, so nothing else
// takes it meanwhile, and no outgoing connection (a node dialling its
// peers) can be given it.
func reservePort(t testing.TB) net.Listener {
	high := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				high = n
			}
		}
	}
	low := 10000
	start := low + rand.Intn(high-low)
	for i := 0; i < high-low; i++ {
		port := low + (start-low+i)%(high-low)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			return l
		}
	}
	t.Fatalf("no free loopback port between %d and %d", low, high)
	return nil
}

// testCluster is the node processes of one cluster.
type testCluster struct {
	t       testing.TB
	root    string
	flags   []string
	held    [][2]net.Listener
	Addrs   []string
	peers   []string
	members string
	nodes   []*testServer
	paused  map[int]bool
	// extra flags of each node (its --peer-routes).
	extra [][]string
}

// nodeFlags: a short election timeout keeps failovers to a second or two;
// 500 ms still rides out the scheduling stalls of a loaded two-core machine.
var nodeFlags = []string{"--heartbeat", "100ms", "--election-timeout", "500ms"}

// startCluster starts n nodes of a cluster of their own. The tests that
// start one call t.Parallel(): their time is mostly spent waiting for
// elections and failovers, and `go test` runs at most GOMAXPROCS of them at
// once (two on a 2-core CI machine, as `cargo test` runs the Rust ones).
func startCluster(t testing.TB, n int, flags ...string) *testCluster {
	c := prepareCluster(t, n, append(append([]string{}, nodeFlags...), flags...))
	for i := 0; i < n; i++ {
		c.start(i)
	}
	return c
}

// prepareCluster reserves the ports of n nodes with flags (nodeFlags not
// added) and starts none.
func prepareCluster(t testing.TB, n int, flags []string) *testCluster {
	c := &testCluster{t: t, root: t.TempDir(), flags: flags, paused: map[int]bool{}, extra: make([][]string, n)}
	var members []string
	for i := 0; i < n; i++ {
		cl, pl := reservePort(t), reservePort(t)
		c.held = append(c.held, [2]net.Listener{cl, pl})
		c.Addrs = append(c.Addrs, cl.Addr().String())
		c.peers = append(c.peers, pl.Addr().String())
		members = append(members, fmt.Sprintf("%d=%s@%s", i+1, c.Addrs[i], c.peers[i]))
	}
	c.members = strings.Join(members, ",")
	c.nodes = make([]*testServer, n)
	return c
}

func (c *testCluster) Servers() string { return strings.Join(c.Addrs, ",") }

func (c *testCluster) start(i int) {
	for _, l := range c.held[i] {
		if l != nil {
			_ = l.Close()
		}
	}
	c.held[i] = [2]net.Listener{}
	flags := append([]string{
		"--data-dir", filepath.Join(c.root, fmt.Sprintf("node%d", i+1)),
		"--node-id", strconv.Itoa(i + 1),
		"--peer-listen", c.peers[i],
		"--initial-cluster", c.members,
	}, c.flags...)
	flags = append(flags, c.extra[i]...)
	c.nodes[i] = startServer(c.t, c.Addrs[i], flags...)
}

func (c *testCluster) kill(i int) {
	if c.nodes[i] != nil {
		c.nodes[i].kill()
		c.nodes[i] = nil
	}
}

// terminate stops node i with SIGTERM and waits for it to exit: its exit
// status, or an error if it did not exit within limit.
func (c *testCluster) terminate(i int) (int, error) {
	s := c.nodes[i]
	s.signal(syscall.SIGTERM)
	select {
	case <-s.exit:
	case <-time.After(limit):
		return -1, fmt.Errorf("node %d did not exit within %v of SIGTERM", i, limit)
	}
	c.nodes[i] = nil
	return s.cmd.ProcessState.ExitCode(), nil
}

func (c *testCluster) pause(i int) {
	c.nodes[i].signal(syscall.SIGSTOP)
	c.paused[i] = true
}

func (c *testCluster) resume(i int) {
	if c.nodes[i] != nil && c.paused[i] {
		c.nodes[i].signal(syscall.SIGCONT)
		delete(c.paused, i)
	}
}

// status is node i's view of the cluster; nil if it does not answer.
func (c *testCluster) status(i int) *pb.ClusterInfo {
	if c.nodes[i] == nil || c.paused[i] {
		return nil
	}
	resp, err := rawCall(c.Addrs[i], &pb.Request{Version: 2, Id: 1, Type: pb.RequestType_ClusterStatus}, 500*time.Millisecond)
	if err != nil || resp.Status != pb.ResponseStatus_Ok {
		return nil
	}
	return resp.Cluster
}

// leader waits for a node other than other (-1: any) that every answering
// node agrees leads, and returns its index.
func (c *testCluster) leader(other int) int {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		votes := map[uint64]int{}
		answered := 0
		for i := range c.nodes {
			if s := c.status(i); s != nil {
				answered++
				if s.LeaderId != 0 {
					votes[s.LeaderId]++
				}
			}
		}
		for id, n := range votes {
			i := int(id) - 1
			if n == answered && i != other && c.nodes[i] != nil && !c.paused[i] {
				if s := c.status(i); s != nil && s.Role == "Leader" {
					return i
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("no leader other than node %d within %v", other, limit)
	return -1
}

// rawCall sends one request on a connection of its own, outside the
// client under test.
func rawCall(addr string, req *pb.Request, timeout time.Duration) (*pb.Response, error) {
	resps, err := rawExchange(addr, [][]byte{rawFrame(req)}, 1, timeout)
	if err != nil {
		return nil, err
	}
	return resps[0], nil
}

func rawFrame(req *pb.Request) []byte {
	body, err := proto.Marshal(req)
	if err != nil {
		panic(err)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// rawExchange writes frames on a new connection and reads n answers.
func rawExchange(addr string, frames [][]byte, n int, timeout time.Duration) ([]*pb.Response, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	for _, f := range frames {
		if _, err := conn.Write(f); err != nil {
			return nil, err
		}
	}
	rd := bufio.NewReader(conn)
	var out []*pb.Response
	for len(out) < n {
		resp, err := readFrame(rd)
		if err != nil {
			return out, fmt.Errorf("after %d answers: %w", len(out), err)
		}
		out = append(out, resp)
	}
	return out, nil
}

// forwarder is a TCP proxy in front of a server whose path can be frozen:
// it then stops moving bytes either way, without a reset, as a cut network
// path does; what it read is held back, and delivered if it is thawed. A
// half-close is passed on as one, so a client's FIN reaches the server
// while the server's answers still come back.
type forwarder struct {
	Addr string
	ln   net.Listener
	mu   sync.Mutex
	// thawed is closed while the path is not frozen.
	thawed chan struct{}
	frozen bool
	done   chan struct{}
	// conns are the connections in the order accepted: the client's side,
	// then the server's.
	conns [][2]net.Conn
}

func startForwarder(t testing.TB, to string) *forwarder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{Addr: ln.Addr().String(), ln: ln, thawed: make(chan struct{}), done: make(chan struct{})}
	close(f.thawed)
	t.Cleanup(func() {
		close(f.done)
		_ = ln.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			_ = c[0].Close()
			_ = c[1].Close()
		}
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", to)
			if err != nil {
				_ = in.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, [2]net.Conn{in, out})
			f.mu.Unlock()
			go f.pipe(in, out)
			go f.pipe(out, in)
		}
	}()
	return f
}

// freeze holds back, from its return on, everything sent either way. (A
// pipe checks after each read, so whatever is sent after the return is
// held, even by a pipe that was in the middle of a read.)
func (f *forwarder) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.frozen {
		f.frozen = true
		f.thawed = make(chan struct{})
	}
}

// thaw delivers what was held back, and moves bytes again.
func (f *forwarder) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		f.frozen = false
		close(f.thawed)
	}
}

// reset resets both sides of the nth connection accepted (from 0), as a
// broken network path does.
func (f *forwarder) reset(n int) {
	f.mu.Lock()
	c := f.conns[n]
	f.mu.Unlock()
	reset(c[0])
	reset(c[1])
}

// gate waits while the path is frozen; false once the test has ended.
func (f *forwarder) gate() bool {
	f.mu.Lock()
	thawed := f.thawed
	f.mu.Unlock()
	select {
	case <-thawed:
		return true
	case <-f.done:
		return false
	}
}

func (f *forwarder) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if !f.gate() {
			return
		}
		if n > 0 {
			if _, werr := to.Write(buf[:n]); werr != nil {
				_ = from.Close()
				return
			}
		}
		if err == io.EOF {
			// A half-close: the other way stays open.
			_ = to.(*net.TCPConn).CloseWrite()
			return
		}
		if err != nil {
			_ = to.Close()
			return
		}
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return ctx
}

func connect(t testing.TB, servers string, opts *Options) *Client {
	t.Helper()
	c, err := Connect(testCtx(t), servers, opts)
	if err != nil {
		t.Fatalf("connect to %s: %v", servers, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitFor polls cond (a cheap check of state another goroutine or process
// changes) until it holds, failing the test after limit.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
