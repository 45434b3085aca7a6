//! Arbitrary lines into the `wary plan` line reader: every output is one line of valid JSON.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const VERDICTS: [&str; 4] = ["ok", "failed", "unknown", "gave_up"];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // The reader is handed one line at a time.
    for line in text.lines() {
        let out = match wary_cli::plan::answer(line) {
            Ok(answer) => answer,
            Err(message) => wary_cli::plan::error_line(&message),
        };
        assert!(!out.contains('\n') && !out.contains('\r'), "more than one line: {out:?}");
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"));
        let obj = v.as_object().expect("a JSON object");
        if let Some(e) = obj.get("error") {
            assert!(e.is_string() && obj.len() == 1, "{out}");
        } else {
            assert_eq!(obj.len(), 2, "{out}");
            let waits = obj["waits"].as_array().expect("waits");
            assert!(waits.iter().all(Value::is_u64), "{out}");
            assert!(VERDICTS.contains(&obj["verdict"].as_str().expect("verdict")), "{out}");
        }
    }
});
