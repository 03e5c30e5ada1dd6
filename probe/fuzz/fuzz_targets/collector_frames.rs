//! The collector's frame decoder on arbitrary byte streams (`check_collector_frames`).
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("../checks.rs");

fuzz_target!(|data: &[u8]| check_collector_frames(data));
