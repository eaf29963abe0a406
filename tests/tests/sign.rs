//! Signed plans: signing the demo plan, refusing unsigned, foreign-signed and modified plans
//! when a key is trusted, and checking weight sections lazily but before first use.

use edge_runtime::Executor;
use std::collections::BTreeSet;

use edge_e2e::{compiled_plan, demo};
use edge_planner::sign::{sign_plan, SecretKey, Signed};
use edge_runtime::{Error, Plan, Session, SignatureError, StageInput, TrustedKey};
use edge_schema::header::{Header, HEADER_LEN};
use edge_schema::plan::{StageKind, Storage};

fn unsigned() -> Vec<u8> {
    compiled_plan(&demo("pixart-shapes-64"), &[(64, 64)], None)
}

fn key(seed: u8) -> SecretKey {
    SecretKey::from_seed(&[seed; 32])
}

fn trusted(k: &SecretKey) -> TrustedKey {
    TrustedKey::from_bytes(&k.public_key()).expect("valid public key")
}

fn signed_by(k: &SecretKey) -> Vec<u8> {
    let mut b = unsigned();
    assert_eq!(
        sign_plan(&mut b, k, false).expect("sign the demo plan"),
        Signed::New
    );
    b
}

fn u64_at(b: &[u8], at: usize) -> usize {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w) as usize
}

/// `n` positions spread over `start..end` (deterministic, distinct when the range allows).
fn spread(start: usize, end: usize, n: usize, salt: usize) -> Vec<usize> {
    let len = end - start;
    (0..n)
        .map(|i| start + (i * len / n + (salt * 7919 + i * 104_729) % (len / n).max(1)) % len)
        .collect()
}

#[test]
fn signed_plan_verifies_with_the_right_key() {
    let k = key(1);
    let plan_bytes = signed_by(&k);
    let plan = Plan::from_bytes_signed(&plan_bytes, &trusted(&k)).expect("signed plan verifies");
    assert_eq!(plan.signer(), Some(k.public_key()));
    // Only the header changed, and a reader without a key still opens it.
    assert_eq!(plan_bytes[HEADER_LEN..], unsigned()[HEADER_LEN..]);
    assert!(Plan::from_bytes(&plan_bytes).is_ok());
    // Signing again with the same key writes the same bytes.
    let mut same = plan_bytes.clone();
    assert_eq!(sign_plan(&mut same, &k, false).unwrap(), Signed::Same);
    assert!(same == plan_bytes);
    // Another key is refused without `resign`, the bytes untouched, and replaces the
    // signature with it.
    let k2 = key(2);
    let mut again = plan_bytes.clone();
    let e = sign_plan(&mut again, &k2, false).unwrap_err().to_string();
    assert!(
        e.contains("already signed")
            && e.contains(&edge_schema::header::encode_hex(&k.public_key()))
            && e.contains("--resign"),
        "{e}"
    );
    assert!(again == plan_bytes);
    assert_eq!(
        sign_plan(&mut again, &k2, true).unwrap(),
        Signed::Replaced(edge_schema::header::encode_hex(&k.public_key()))
    );
    Plan::from_bytes_signed(&again, &trusted(&k2)).expect("re-signed plan verifies");
}

#[test]
fn unsigned_plan_is_refused_when_a_key_is_trusted() {
    let err = Plan::from_bytes_signed(&unsigned(), &trusted(&key(1))).unwrap_err();
    assert!(
        matches!(err, Error::Signature(SignatureError::Unsigned)),
        "{err}"
    );
    assert!(err.to_string().contains("not signed"), "{err}");
}

#[test]
fn plan_signed_by_another_key_is_refused() {
    let err = Plan::from_bytes_signed(&signed_by(&key(2)), &trusted(&key(1))).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Signature(SignatureError::UntrustedSigner { .. })
        ),
        "{err}"
    );
}

#[test]
fn forged_signer_key_is_refused() {
    // Another key's signature with the trusted key written into the block (and the header
    // digest recomputed, as an attacker would): the signature does not verify.
    let good = key(1);
    let mut bytes = signed_by(&key(2));
    let mut h = Header::read(&bytes).unwrap();
    let mut block = h.signature_block().unwrap().unwrap();
    block.public_key = good.public_key();
    h.set_signature_block(&block);
    bytes[..HEADER_LEN].copy_from_slice(&h.to_bytes());
    let err = Plan::from_bytes_signed(&bytes, &trusted(&good)).unwrap_err();
    assert!(
        matches!(err, Error::Signature(SignatureError::BadSignature { .. })),
        "{err}"
    );
}

#[test]
fn modified_and_redigested_header_is_refused() {
    // Change the metadata digest and fix up the header digest: only the signature catches it.
    let k = key(1);
    let mut bytes = signed_by(&k);
    let mut h = Header::read(&bytes).unwrap();
    h.meta_digest[0] ^= 1;
    h.header_digest = h.compute_digest();
    bytes[..HEADER_LEN].copy_from_slice(&h.to_bytes());
    let err = Plan::from_bytes_signed(&bytes, &trusted(&k)).unwrap_err();
    assert!(
        matches!(err, Error::Signature(SignatureError::BadSignature { .. })),
        "{err}"
    );
}

#[test]
fn flipped_bits_anywhere_are_refused() {
    let k = key(1);
    let tk = trusted(&k);
    let good = signed_by(&k);
    let (w0, wlen) = (u64_at(&good, 32), u64_at(&good, 40));
    let (m0, mlen) = (u64_at(&good, 16), u64_at(&good, 24));
    assert_eq!(m0 + mlen, good.len());
    let mut positions: BTreeSet<usize> = BTreeSet::new();
    positions.extend(spread(0, 88, 10, 1)); // header fields
    positions.extend(spread(88, 96, 3, 2)); // signature marker
    positions.extend(spread(96, 128, 5, 3)); // public key
    positions.extend(spread(128, 192, 12, 4)); // signature
    positions.extend(spread(192, HEADER_LEN, 5, 5)); // zero tail and header digest
    positions.extend(spread(HEADER_LEN, w0, 5, 6)); // padding
    positions.extend(spread(w0, w0 + wlen, 40, 7)); // weights
    positions.extend(spread(m0, m0 + mlen, 20, 8)); // metadata
    positions.extend([0, HEADER_LEN - 1, w0, m0 - 1, m0, good.len() - 1]);
    assert!(positions.len() >= 100, "{} positions", positions.len());
    for (i, &p) in positions.iter().enumerate() {
        let bit = 1u8 << (i % 8);
        let mut b = good.clone();
        b[p] ^= bit;
        assert!(
            Plan::from_bytes_signed(&b, &tk).is_err(),
            "byte {p} xor {bit:#x} accepted (weights {w0}..{}, metadata {m0}..)",
            w0 + wlen
        );
    }
}

/// Sections holding the weights that stage `s` reads.
fn sections_of(plan: &Plan, s: usize) -> BTreeSet<usize> {
    let meta = plan.meta();
    meta.stages[s]
        .values
        .iter()
        .filter_map(|v| match v.storage {
            Storage::Weight(t) => Some(meta.tensors[t as usize].section as usize),
            Storage::Arena(_) | Storage::Input(_) => None,
        })
        .chain(
            meta.stages[s]
                .segments
                .iter()
                .filter_map(|g| g.section.map(|x| x as usize)),
        )
        .collect()
}

#[test]
fn sections_are_checked_lazily_but_before_first_use() {
    let k = key(1);
    let good = signed_by(&k);
    let reference = Plan::from_bytes(&good).unwrap();
    let meta = reference.meta();
    let stage = |kind| {
        meta.stages
            .iter()
            .position(|s| s.kind == kind)
            .expect("stage present")
    };
    let (text, decoder) = (stage(StageKind::TextEncoder), stage(StageKind::VaeDecoder));
    let text_secs = sections_of(&reference, text);
    let victim = *sections_of(&reference, decoder)
        .difference(&text_secs)
        .next()
        .expect("a decoder section the text encoder does not use");
    let sec = &meta.sections[victim];
    let at = u64_at(&good, 32) + (sec.offset + sec.len / 2) as usize;
    let mut bad = good.clone();
    bad[at] ^= 0x10;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flipped.plan");
    std::fs::write(&path, &bad).unwrap();
    // Opening checks header, signature and metadata only: it succeeds.
    let plan = Plan::open_signed(&path, &trusted(&k)).expect("lazy open");
    let mut session = Session::new(&plan, edge_kernels::generic(), None).unwrap();

    // The text encoder does not touch the damaged section and runs.
    let ts = &meta.stages[text];
    let l = ts.values[ts.inputs[0] as usize].shape[0] as usize;
    let hidden: usize = ts.values[ts.outputs[0] as usize]
        .shape
        .iter()
        .product::<u64>() as usize;
    let ids = vec![0i32; l];
    let mask = vec![1f32; l];
    let mut out = vec![0f32; hidden];
    session
        .run_stage(
            text as u32,
            &[StageInput::I32(&ids), StageInput::F32(&mask)],
            &mut [&mut out],
        )
        .expect("text encoder runs: its sections are intact");

    // The decoder is refused before it reads the damaged weights.
    let ds = &meta.stages[decoder];
    let lat: usize = ds.values[ds.inputs[0] as usize]
        .shape
        .iter()
        .product::<u64>() as usize;
    let img: usize = ds.values[ds.outputs[0] as usize]
        .shape
        .iter()
        .product::<u64>() as usize;
    let latent = vec![0f32; lat];
    let mut image = vec![0f32; img];
    let err = session
        .run_stage(
            decoder as u32,
            &[StageInput::F32(&latent)],
            &mut [&mut image],
        )
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("weight section {victim}"))
            && msg.contains("checksum")
            && msg.contains("flipped.plan"),
        "{msg}"
    );
    assert!(image.iter().all(|&x| x == 0.0), "decoder wrote output");
    // The outcome is remembered, and the whole-file check finds it too.
    assert!(plan.section_checked(victim).is_err());
    assert!(plan.verify_all_sections().is_err());
    for t in meta
        .tensors
        .iter()
        .enumerate()
        .filter(|(_, e)| e.section as usize == victim)
    {
        assert!(plan.tensor_bytes(t.0 as u32).is_err());
    }
    // The same bytes through the eager path are refused at once.
    assert!(Plan::from_bytes(&bad).is_err());
    // And the intact file opens and verifies in full.
    std::fs::write(&path, &good).unwrap();
    let plan = Plan::open_signed(&path, &trusted(&k)).unwrap();
    plan.verify_all_sections().unwrap();
}
