//! Measurements: latency histograms, run control, the server's CPU and
//! memory from /proc (`dlock_testkit::proc_sample`), and the report.

use dlock_testkit::proc_sample::ProcSample;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bounds a run by time and, optionally, by operation count; shared by
/// every worker so the whole run stops by itself.
#[derive(Clone)]
pub struct Control {
    deadline: Instant,
    max_ops: u64,
    done: Arc<AtomicU64>,
}

impl Control {
    /// A run of at most `duration` and at most `ops` operations.
    pub fn new(duration: Duration, ops: Option<u64>) -> Control {
        Control {
            deadline: Instant::now() + duration,
            max_ops: ops.unwrap_or(u64::MAX),
            done: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Claims one more operation; false once the run is over.
    pub fn next(&self) -> bool {
        Instant::now() < self.deadline && self.done.fetch_add(1, Ordering::Relaxed) < self.max_ops
    }

    /// Operations claimed so far.
    pub fn claimed(&self) -> u64 {
        self.done.load(Ordering::Relaxed).min(self.max_ops)
    }

    /// When the run ends at the latest.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// Latencies and counts of one worker.
pub struct Recorder {
    /// Latencies in microseconds.
    pub hist: Histogram<u64>,
    /// Completed operations.
    pub ops: u64,
    /// Failed operations.
    pub errors: u64,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            // Microseconds up to an hour at 3 significant digits: a few KiB.
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("constant histogram bounds are valid"),
            ops: 0,
            errors: 0,
        }
    }
}

impl Recorder {
    /// Records one successful operation that took `took`.
    pub fn ok(&mut self, took: Duration) {
        self.ops += 1;
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        self.hist.saturating_record(micros);
    }

    /// Records one operation started at `started`: its latency when it
    /// succeeded, an error otherwise.
    pub fn outcome(&mut self, succeeded: bool, started: std::time::Instant) {
        if succeeded {
            self.ok(started.elapsed());
        } else {
            self.errors += 1;
        }
    }

    /// Merges another worker's figures into this one.
    pub fn merge(&mut self, other: &Recorder) {
        self.ops += other.ops;
        self.errors += other.errors;
        let _ = self.hist.add(&other.hist);
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Serialize, Default)]
pub struct Latency {
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl Latency {
    /// Percentiles of `hist`.
    pub fn of(hist: &Histogram<u64>) -> Latency {
        if hist.is_empty() {
            return Latency::default();
        }
        Latency {
            p50_us: hist.value_at_quantile(0.50),
            p90_us: hist.value_at_quantile(0.90),
            p99_us: hist.value_at_quantile(0.99),
            p999_us: hist.value_at_quantile(0.999),
            max_us: hist.max(),
        }
    }
}

/// Server-side figures of a run.
#[derive(Debug, Serialize)]
pub struct ServerFigures {
    /// Server CPU time per operation, microseconds.
    pub cpu_us_per_op: f64,
    /// Server CPU use during the run, in cores.
    pub cpu_cores: f64,
    /// Resident set size at the end, MiB.
    pub rss_mib: f64,
    /// Peak resident set size so far, MiB.
    pub peak_rss_mib: f64,
}

/// The result of one workload.
#[derive(Debug, Serialize)]
pub struct Report {
    pub workload: String,
    pub connections: usize,
    pub duration_s: f64,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub errors: u64,
    pub latency: Latency,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerFigures>,
    /// Figures particular to the workload.
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Report {
    /// Builds a report from merged figures and the server samples around the run.
    pub fn new(
        workload: &str,
        connections: usize,
        elapsed: Duration,
        rec: &Recorder,
        before: Option<ProcSample>,
        after: Option<ProcSample>,
    ) -> Report {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let server = match (before, after) {
            (Some(b), Some(a)) => {
                let cpu = a.cpu.saturating_sub(b.cpu).as_secs_f64();
                Some(ServerFigures {
                    cpu_us_per_op: if rec.ops > 0 {
                        cpu * 1e6 / rec.ops as f64
                    } else {
                        0.0
                    },
                    cpu_cores: cpu / secs,
                    rss_mib: mib(a.rss),
                    peak_rss_mib: mib(a.hwm),
                })
            }
            _ => None,
        };
        Report {
            workload: workload.to_string(),
            connections,
            duration_s: secs,
            ops: rec.ops,
            ops_per_sec: rec.ops as f64 / secs,
            errors: rec.errors,
            latency: Latency::of(&rec.hist),
            server,
            extra: BTreeMap::new(),
        }
    }

    /// Adds a workload-specific figure.
    pub fn with(mut self, name: &str, value: impl Into<serde_json::Value>) -> Report {
        self.extra.insert(name.to_string(), value.into());
        self
    }

    /// Prints the report as a table.
    pub fn print_table(&self) {
        println!("workload      {}", self.workload);
        println!("connections   {}", self.connections);
        println!("duration      {:.2} s", self.duration_s);
        println!(
            "ops           {}  ({:.0} ops/s)",
            self.ops, self.ops_per_sec
        );
        println!("errors        {}", self.errors);
        let l = &self.latency;
        println!(
            "latency µs    p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
            l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
        );
        if let Some(s) = &self.server {
            println!(
                "server        {:.2} µs CPU/op  {:.2} cores  RSS {:.1} MiB (peak {:.1} MiB)",
                s.cpu_us_per_op, s.cpu_cores, s.rss_mib, s.peak_rss_mib
            );
        }
        for (k, v) in &self.extra {
            println!("{k:<13} {v}");
        }
    }
}

/// Bytes to MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
