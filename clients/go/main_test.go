package dlock

import (
	"fmt"
	"os"
	"testing"
)

// TestMain starts one server for the Example functions, which connect as a
// program would: to DLOCK_SERVER. Run by a turns test as its other process
// (owners_test.go), the binary is that process instead.
func TestMain(m *testing.M) {
	if spec := os.Getenv(otherOwnerEnv); spec != "" {
		os.Exit(otherOwner(spec))
	}
	s, err := launch(serverPath(), "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "dlock tests:", err)
		if s != nil {
			s.kill()
		}
		os.Exit(1)
	}
	os.Setenv("DLOCK_SERVER", s.Addr)
	code := m.Run()
	s.kill()
	os.Exit(code)
}
