//! One run of the checker over a configuration: breadth first, so the
//! counterexample it reports is a shortest one, with the counts the docs
//! quote.

use std::hash::Hash;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model, Path};

use crate::model::SessionModel;
use crate::Config;

/// A property's name and the path the checker found for it.
pub type Found<M> = (
    &'static str,
    Path<<M as Model>::State, <M as Model>::Action>,
);

/// What one run of model `M` found.
pub struct Report<M: Model = SessionModel> {
    /// States generated, repeats included.
    pub states: usize,
    /// Distinct states.
    pub unique: usize,
    /// The deepest path explored.
    pub depth: usize,
    /// How long it took.
    pub took: Duration,
    /// A path to a state that breaks (for `always`) or shows (for
    /// `sometimes`) each property, by name.
    pub found: Vec<Found<M>>,
}

impl<M: Model> Report<M> {
    /// The path found for `property`, if any.
    pub fn path(&self, property: &str) -> Option<&Path<M::State, M::Action>> {
        self.found
            .iter()
            .find(|(name, _)| *name == property)
            .map(|(_, p)| p)
    }
}

/// Checks `cfg` on every core. With `stop_at_failure`, stops at the first
/// property broken (a bug's run); otherwise explores every state within
/// the bounds.
pub fn run(cfg: Config, stop_at_failure: bool) -> Report {
    run_model(SessionModel::new(cfg), stop_at_failure)
}

/// The same for any `model` (the replication model's too).
pub fn run_model<M>(model: M, stop_at_failure: bool) -> Report<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let finish = stop_at_failure.then_some(HasDiscoveries::AnyFailures);
    check(model, finish, threads, None)
}

/// A shortest path to `property` broken (or shown, for a `sometimes`
/// one) in a small `model`, whatever else breaks first, by runs bounded
/// one step deeper each time. (A run records the last path it met for a
/// property, not the first: within one run the path may be longer.)
pub fn find<M>(model: M, property: &'static str) -> Report<M>
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    let finish = || HasDiscoveries::AnyOf([property].into_iter().collect());
    let mut depth = 1;
    loop {
        let r = check(model.clone(), Some(finish()), 1, Some(depth));
        if r.path(property).is_some() || r.depth < depth {
            return r;
        }
        depth += 1;
    }
}

fn check<M>(
    model: M,
    finish: Option<HasDiscoveries>,
    threads: usize,
    depth: Option<usize>,
) -> Report<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    let names: Vec<&'static str> = model.properties().iter().map(|p| p.name).collect();
    let start = Instant::now();
    let mut builder = model.checker();
    if let Some(finish) = finish {
        builder = builder.finish_when(finish);
    }
    if let Some(depth) = depth {
        builder = builder.target_max_depth(depth);
    }
    let checker = builder.threads(threads).spawn_bfs().join();
    let took = start.elapsed();
    let found = names
        .into_iter()
        .filter_map(|name| checker.discovery(name).map(|p| (name, p)))
        .collect();
    Report {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        took,
        found,
    }
}
