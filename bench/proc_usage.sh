# What running processes have used so far, read from /proc: sourced by the
# bench scripts that compare CPU per operation (not run on its own).

# The CPU time (user + system, in seconds) the pids have used so far,
# summed; exited threads' time included (the process totals in stat).
proc_cpu() { # PID...
  local p
  for p in "$@"; do cat "/proc/$p/stat"; done |
    awk -v t="$(getconf CLK_TCK)" '{ s += $14 + $15 } END { printf "%.2f\n", s / t }'
}

# The CPU time of each pid on its own, space separated.
proc_cpu_each() { # PID...
  local p
  for p in "$@"; do proc_cpu "$p"; done | xargs
}

# Context switches (voluntary + involuntary) of every thread of the pids,
# summed: each is a thread put to sleep or off its core, and nearly every
# voluntary one is later a wake-up. A process's own status counts only its
# main thread, hence every task. A thread that exits between two readings
# takes its count with it (tokio's blocking threads retire after 10 s idle),
# so a difference can only be short, never long.
proc_switches() { # PID...
  local p
  for p in "$@"; do cat "/proc/$p"/task/*/status 2>/dev/null || true; done |
    awk '/^(non)?voluntary_ctxt_switches:/ { s += $2 } END { print s + 0 }'
}
