//! Every decoder of outside trace-context input: binary, text, envelope, traceparent.
//! Nothing may panic, and whatever decodes must encode back to the same bytes.
#![no_main]

use hoptrace_probe::carrier::envelope;
use hoptrace_probe::{TraceContext, traceparent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ctx) = TraceContext::decode(data) {
        assert_eq!(ctx.to_bytes(), data, "binary form is canonical");
    }
    if let Ok((ctx, used)) = TraceContext::decode_prefix(data) {
        assert_eq!(ctx.to_bytes(), &data[..used]);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(ctx) = TraceContext::decode_text(text) {
            assert_eq!(ctx.to_text(), text, "text form is canonical");
        }
    }
    if let Ok((e, payload)) = envelope::unwrap(data) {
        assert_eq!(envelope::wrap(&e.context, payload), data);
    }
    let _ = traceparent::parse(data);
});
