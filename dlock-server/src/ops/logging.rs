//! The server's log: the default filter, and openraft's repeated lines
//! paced.
//!
//! openraft logs for its developers. Several of its warnings and errors
//! come once per RPC or per election round, and last as long as their
//! cause: a node cut off from its peers logs "while requesting vote" for
//! every peer at every election (about five lines a second with the
//! default timing), for as long as the partition lasts. dlock reports those
//! causes itself, once and then once a minute (a peer that does not
//! answer, `engine/raft/reachability.rs`; a peer that refuses this node,
//! `engine/raft/paced.rs`). So each of openraft's warning and error lines
//! is written once, then at most once a minute from the same place in its
//! code; dlock's own lines are never held back. A filter given with
//! `--log-level` or `RUST_LOG` is paced the same way.

use crate::LogFormat;
use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::callsite::Identifier;
use tracing::subscriber::Interest;
use tracing::{Level, Metadata};
use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// openraft logs every election step and vote at info: an operator wants
/// dlock's own lines and openraft's warnings. Its replication streams log
/// an error for every failed RPC to a peer that is down or refuses this
/// node, and its leader a warning for each (`replication_handler`): the
/// peer client reports those itself. What else those modules log is hidden
/// too: a storage error while replicating stops the node, which logs the
/// cause itself; a snapshot that cannot be sent is retried (set
/// `--log-level info,openraft=warn` to see every line).
pub const DEFAULT_FILTER: &str =
    "info,openraft=warn,openraft::replication=off,openraft::engine::handler::replication_handler=error";

/// How often a line from one place in openraft's code is written again.
const REPEAT: Duration = Duration::from_secs(60);

/// Passes openraft's warnings and errors once a minute per callsite,
/// and everything else.
#[derive(Default)]
pub struct PacedDependency {
    last: Mutex<HashMap<Identifier, Instant>>,
}

impl PacedDependency {
    fn paces(meta: &Metadata<'_>) -> bool {
        meta.is_event() && *meta.level() <= Level::WARN && meta.target().starts_with("openraft")
    }

    /// Whether the event at `meta`'s callsite is to be written now at
    /// `now`: the first, then one a [`REPEAT`].
    fn due(&self, meta: &Metadata<'_>, now: Instant) -> bool {
        if !Self::paces(meta) {
            return true;
        }
        // Plain instants, valid whatever a panicking holder did.
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.get(&meta.callsite()) {
            Some(&at) if now.duration_since(at) < REPEAT => false,
            _ => {
                last.insert(meta.callsite(), now);
                true
            }
        }
    }
}

impl<S> Filter<S> for PacedDependency {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        self.due(meta, Instant::now())
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        // Asked at every event only where the answer changes.
        if Self::paces(meta) {
            Interest::sometimes()
        } else {
            Interest::always()
        }
    }
}

/// The filter `--log-level` names, else `RUST_LOG`, else
/// [`DEFAULT_FILTER`].
///
/// # Errors
/// The filter given does not parse, or one of its directives is a lone word
/// that is not a level.
pub fn filter(level: Option<&str>) -> Result<EnvFilter, String> {
    let env = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let given = level.or(env.as_deref().filter(|v| !v.trim().is_empty()));
    let Some(given) = given else {
        return EnvFilter::try_new(DEFAULT_FILTER).map_err(|e| e.to_string());
    };
    if let Some(word) = lone_non_level(given) {
        return Err(format!(
            "{word:?} is not a level (error, warn, info, debug, trace, off); a filter is a \
             level, TARGET=LEVEL, or several of them separated by commas, e.g. \
             info,dlock_server=debug"
        ));
    }
    EnvFilter::try_new(given).map_err(|e| e.to_string())
}

/// The first directive of `filter` that is a single word other than a
/// level. The filter's own syntax reads one as a target to log at every
/// level, and nothing else: a mistyped level (`inof`) would silence the
/// whole log without a word.
fn lone_non_level(filter: &str) -> Option<&str> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    filter.split(',').map(str::trim).find(|d| {
        !d.is_empty()
            && !d.contains(['=', '['])
            && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(d))
    })
}

/// Logs to standard error in `format` through `filter`, openraft's
/// repeated lines paced (see the module documentation).
pub fn init(filter: EnvFilter, format: LogFormat) {
    // The level filter first, so lines it drops never take a pacing slot.
    let filter = filter.and(PacedDependency::default());
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry();
    match format {
        LogFormat::Text => registry
            .with(
                lines
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_filter(filter),
            )
            .init(),
        // Fields at the top level and only the innermost span (a
        // connection's peer): flat objects are what log collectors index.
        LogFormat::Json => registry
            .with(
                lines
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_filter(filter),
            )
            .init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::field::FieldSet;
    use tracing::metadata::Kind;

    struct Site(&'static str);
    impl tracing::Callsite for Site {
        fn set_interest(&self, _: Interest) {}
        fn metadata(&self) -> &Metadata<'_> {
            unreachable!("{}", self.0)
        }
    }
    static VOTE: Site = Site("vote");
    static REPLICATE: Site = Site("replicate");
    static OURS: Site = Site("ours");

    fn meta(site: &'static Site, target: &'static str, level: Level) -> Metadata<'static> {
        Metadata::new(
            site.0,
            target,
            level,
            None,
            None,
            None,
            FieldSet::new(&["message"], Identifier(site)),
            Kind::EVENT,
        )
    }

    #[test]
    fn a_mistyped_level_is_refused_not_read_as_a_target() {
        assert_eq!(lone_non_level("inof"), Some("inof"));
        assert_eq!(lone_non_level("info,bogus"), Some("bogus"));
        for fine in [
            "info",
            "WARN",
            "debug,openraft=warn",
            "dlock_server=trace",
            " info , off",
        ] {
            assert_eq!(lone_non_level(fine), None, "{fine}");
        }
        assert!(filter(Some("inof")).is_err());
        assert!(filter(Some("dlock_server=bogus")).is_err());
        assert!(filter(Some("info,openraft=warn")).is_ok());
    }

    #[test]
    fn an_openraft_warning_is_written_once_a_minute_per_callsite_and_ours_always() {
        let paced = PacedDependency::default();
        let t0 = Instant::now();
        let vote = meta(&VOTE, "openraft::core::raft_core", Level::ERROR);
        let replicate = meta(&REPLICATE, "openraft::replication", Level::WARN);
        assert!(paced.due(&vote, t0));
        assert!(!paced.due(&vote, t0 + Duration::from_millis(200)));
        assert!(paced.due(&replicate, t0), "another callsite is its own");
        assert!(!paced.due(&vote, t0 + REPEAT - Duration::from_millis(1)));
        assert!(paced.due(&vote, t0 + REPEAT));
        // openraft's info and below (when a filter lets them through) and
        // dlock's own lines are not paced.
        let info = meta(&VOTE, "openraft::core::raft_core", Level::INFO);
        let ours = meta(&OURS, "dlock_server::engine::raft", Level::ERROR);
        for _ in 0..3 {
            assert!(paced.due(&info, t0) && paced.due(&ours, t0));
        }
    }
}
