//! The collector's frame decoder on arbitrary byte streams: nothing may panic, a frame
//! that decodes must survive encode + decode unchanged, and a stream split in two
//! decodes to the same frames.
#![no_main]

use hoptrace_probe::protocol::{Frame, MAX_FRAME_LEN, decode_frames, read_frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut whole = Vec::new();
    let used = decode_frames(data, MAX_FRAME_LEN, |f| whole.push(f));
    if let Ok(used) = used {
        let mut again = Vec::new();
        for f in &whole {
            f.encode(&mut again);
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
});
