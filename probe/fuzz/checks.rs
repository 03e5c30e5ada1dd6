// The properties the fuzz targets check, shared with the stable corpus test
// (`probe/tests/fuzz_corpus.rs`), which runs them over generated inputs in every test run.
// Included with `include!`, so it names everything by full path.

/// The collector's frame decoder on arbitrary byte streams: nothing may panic, a frame
/// that decodes must survive encode + decode unchanged, and a stream split in two decodes
/// to the same frames.
#[allow(dead_code)]
pub fn check_collector_frames(data: &[u8]) {
    use hoptrace_protocol::{Frame, MAX_FRAME_LEN, decode_frames, read_frame};
    let mut whole = Vec::new();
    let used = decode_frames(data, MAX_FRAME_LEN, |f| whole.push(f));
    if let Ok(used) = used {
        let mut again = Vec::new();
        for f in &whole {
            f.encode(&mut again).expect("a decoded frame encodes again");
        }
        // Lenient fields (unknown clock source codes, any non-zero `synced`) normalise,
        // so compare frames, not bytes.
        let mut round = Vec::new();
        decode_frames(&again, MAX_FRAME_LEN, |f| round.push(f)).unwrap();
        assert_eq!(round, whole);
        let split = data.len() / 2;
        let mut parts = Vec::new();
        let first = decode_frames(&data[..split], MAX_FRAME_LEN, |f| parts.push(f)).unwrap();
        let _ = decode_frames(&data[first..used], MAX_FRAME_LEN, |f| parts.push(f));
        assert_eq!(parts, whole);
    }
    if data.len() > 1 {
        let _ = Frame::decode(data[0], &data[1..]);
    }
    let mut r = data;
    while read_frame(&mut r, MAX_FRAME_LEN).is_ok() {}
}

/// Every decoder of outside trace-context input: binary, text, envelope, traceparent.
/// Nothing may panic, and whatever decodes must encode back to the same bytes.
#[allow(dead_code)]
pub fn check_trace_context(data: &[u8]) {
    use hoptrace_probe::carrier::envelope;
    use hoptrace_probe::{TraceContext, traceparent};
    if let Ok(ctx) = TraceContext::decode(data) {
        assert_eq!(ctx.to_bytes(), data, "binary form is canonical");
    }
    if let Ok((ctx, used)) = TraceContext::decode_prefix(data) {
        assert_eq!(ctx.to_bytes(), &data[..used]);
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(ctx) = TraceContext::decode_text(text)
    {
        assert_eq!(ctx.to_text(), text, "text form is canonical");
    }
    if let Ok((e, payload)) = envelope::unwrap(data) {
        assert_eq!(envelope::wrap(&e.context, payload), data);
    }
    let _ = traceparent::parse(data);
}
