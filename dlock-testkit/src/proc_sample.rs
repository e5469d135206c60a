//! CPU time and memory of a process, read from Linux's /proc:
//! what `dlock-bench`, `dlock-torture` and the server's
//! resource tests report about the server they drive.

use std::time::Duration;

/// One reading of a process's resource use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcSample {
    /// User + system CPU time so far.
    pub cpu: Duration,
    /// Resident set size now, in bytes.
    pub rss: u64,
    /// Peak resident set size so far, in bytes.
    pub hwm: u64,
}

impl ProcSample {
    /// Reads /proc/PID; `None` if the process is gone, /proc is absent (not
    /// Linux) or its format is not the one expected.
    pub fn read(pid: u32) -> Option<ProcSample> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        Some(ProcSample {
            cpu: cpu_time(&stat, clock_ticks()?)?,
            rss: status_bytes(&status, "VmRSS:")?,
            hwm: status_bytes(&status, "VmHWM:")?,
        })
    }

    /// Reads this process's own figures.
    pub fn of_self() -> Option<ProcSample> {
        ProcSample::read(std::process::id())
    }
}

/// Clock ticks per second, the unit of /proc/PID/stat's times.
fn clock_ticks() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|t| *t > 0)
}

/// utime + stime of a /proc/PID/stat line.
fn cpu_time(stat: &str, ticks: u64) -> Option<Duration> {
    // The fields after the command name, which is in parentheses and may
    // itself hold spaces and parentheses: utime and stime are the 14th and
    // 15th fields of the whole line, the 12th and 13th after the name.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let nanos = u128::from(utime + stime) * 1_000_000_000 / u128::from(ticks);
    Some(Duration::from_nanos(u64::try_from(nanos).ok()?))
}

/// A `kB` field of /proc/PID/status, in bytes.
fn status_bytes(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_found_after_a_command_name_with_spaces() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0";
        assert_eq!(cpu_time(stat, 100), Some(Duration::from_secs(3)));
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(status_bytes(status, "VmRSS:"), Some(1024 * 1024));
        assert_eq!(status_bytes(status, "VmHWM:"), Some(2048 * 1024));
        assert_eq!(status_bytes(status, "VmSwap:"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_can_be_sampled() {
        let s = ProcSample::of_self().expect("/proc on Linux");
        assert!(s.rss > 0 && s.hwm >= s.rss);
    }
}
