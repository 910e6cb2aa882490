//! Any bytes given to the entry decoder give an entry or an error, never a panic;
//! an entry that decodes survives an encode/decode round trip unchanged. Each input
//! is tried as it is and with a valid checksum, so the fuzzer reaches the body checks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orion_format::Entry;

fn check(data: &[u8]) {
    if let Ok((entry, lines)) = Entry::decode(data) {
        assert_eq!(lines, entry.lines());
        let again = entry.encode();
        assert_eq!(again.len(), lines * 64);
        assert_eq!(Entry::decode(&again).map(|(e, _)| e), Ok(entry));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut sealed = data.to_vec();
    Entry::seal(&mut sealed);
    check(&sealed);
});
