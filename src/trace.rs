//! Wall-clock events of the GPU operators, for finding where a query's time
//! goes on a GPU machine without a system profiler: with the environment
//! variable `DATAFUSION_GPU_TRACE` set, each event is printed to stderr as
//! milliseconds since the first event, the thread, and what happened.
//! Unset (the default), an event costs one load of a cached flag.

use std::sync::OnceLock;
use std::time::Instant;

/// The variable that turns tracing on.
pub const TRACE_VAR: &str = "DATAFUSION_GPU_TRACE";

fn start() -> Option<&'static Instant> {
    static START: OnceLock<Option<Instant>> = OnceLock::new();
    START
        .get_or_init(|| std::env::var_os(TRACE_VAR).map(|_| Instant::now()))
        .as_ref()
}

/// Whether tracing is on: where an event needs measures of its own.
pub fn enabled() -> bool {
    start().is_some()
}

/// Prints the event `what` describes, when tracing is on.
pub fn event(what: impl FnOnce() -> String) {
    if let Some(start) = start() {
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let thread = format!("{:?}", std::thread::current().id());
        eprintln!("[gpu-trace] {ms:10.3} ms  {thread:<14} {}", what());
    }
}
