// Package dlock is the Go client of dlock, a lock server: one Client
// pipelines the calls of any number of goroutines on one connection (on a
// cluster, a session that survives failovers), and every Lock knows from
// its own clock when it can no longer be assumed held (Lock.Lost).
//
// Each lock has an owner of its own: tasks (threads, goroutines) sharing
// one client that lock the same key take turns, first come first served,
// exactly as separate processes do; unrelated locks share the client's one
// pipelined connection, and a lock whose key another lock of this client
// holds, or that must wait, is taken on a connection of its own.
//
// A Lock is a held grant, not a reentrant mutex: a second Lock of a key
// from the goroutine that holds it waits like any other caller, so without
// a wait limit it waits for ever.
package dlock
