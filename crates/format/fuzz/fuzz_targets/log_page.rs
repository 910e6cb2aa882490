//! A whole 4 KiB log page from the media: header, then entries walked to the end of
//! the page as a log walk does (checksums sealed so the walk goes deep). Every other
//! on-media decoder (the GC's compaction record too) gets the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orion_format::{
    decode_holders, Compaction, Entry, InodeSlot, JournalRecord, LogPageHeader, Superblock,
    LOG_PAGE_HEADER,
};

fuzz_target!(|data: &[u8]| {
    let _ = Superblock::decode(data);
    let _ = InodeSlot::decode(data);
    let _ = JournalRecord::decode(data);
    let _ = decode_holders(data);
    let _ = Compaction::decode(data);
    let mut page = data[..data.len().min(4096)].to_vec();
    LogPageHeader::seal(&mut page);
    if LogPageHeader::decode(&page).is_ok() {
        let mut at = LOG_PAGE_HEADER as usize;
        while at < page.len() {
            Entry::seal(&mut page[at..]);
            match Entry::decode(&page[at..]) {
                Ok((_, lines)) => at += lines * 64,
                Err(_) => break,
            }
        }
    }
});
