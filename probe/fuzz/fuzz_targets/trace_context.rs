//! Every decoder of outside trace-context input (`check_trace_context`).
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("../checks.rs");

fuzz_target!(|data: &[u8]| check_trace_context(data));
