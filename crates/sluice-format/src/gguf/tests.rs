use std::path::{Path, PathBuf};

use super::types::TYPES;
use super::*;
use crate::FormatError;

fn p() -> &'static Path {
    Path::new("x.gguf")
}

fn s(out: &mut Vec<u8>, v: &str) {
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    out.extend_from_slice(v.as_bytes());
}

/// Hand-built GGUF bytes.
#[derive(Clone)]
struct B {
    version: u32,
    n_kv: u64,
    kv: Vec<u8>,
    n_t: u64,
    ti: Vec<u8>,
    align: u64,
    data: Vec<u8>,
}

fn b() -> B {
    B {
        version: 3,
        n_kv: 0,
        kv: vec![],
        n_t: 0,
        ti: vec![],
        align: 32,
        data: vec![],
    }
}

impl B {
    fn kv(mut self, key: &str, ty: u32, payload: &[u8]) -> B {
        s(&mut self.kv, key);
        self.kv.extend_from_slice(&ty.to_le_bytes());
        self.kv.extend_from_slice(payload);
        self.n_kv += 1;
        self
    }
    fn u32kv(self, key: &str, v: u32) -> B {
        self.kv(key, 4, &v.to_le_bytes())
    }
    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, off: u64) -> B {
        s(&mut self.ti, name);
        self.ti
            .extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            self.ti.extend_from_slice(&d.to_le_bytes());
        }
        self.ti.extend_from_slice(&ty.to_le_bytes());
        self.ti.extend_from_slice(&off.to_le_bytes());
        self.n_t += 1;
        self
    }
    fn data(mut self, n: usize) -> B {
        self.data = vec![0; n];
        self
    }
    fn bytes(&self) -> Vec<u8> {
        let mut o = b"GGUF".to_vec();
        o.extend_from_slice(&self.version.to_le_bytes());
        o.extend_from_slice(&self.n_t.to_le_bytes());
        o.extend_from_slice(&self.n_kv.to_le_bytes());
        o.extend_from_slice(&self.kv);
        o.extend_from_slice(&self.ti);
        while !(o.len() as u64).is_multiple_of(self.align) {
            o.push(0);
        }
        o.extend_from_slice(&self.data);
        o
    }
    fn parse(&self) -> Result<Gguf, FormatError> {
        let v = self.bytes();
        parse(&v, v.len() as u64, p())
    }
}

fn err(r: Result<Gguf, FormatError>) -> String {
    match r {
        Ok(g) => panic!("accepted: {g:?}"),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn refused(bb: &B, needle: &str) {
    let e = err(bb.parse());
    assert!(e.contains(needle), "`{e}` lacks `{needle}`");
    assert!(e.starts_with("x.gguf: "), "`{e}` does not name the file");
}

#[test]
fn hand_built_header_parses() {
    let g = b()
        .u32kv("general.alignment", 64)
        .tensor("w", &[64, 2], 8, 0) // Q8_0: 2 rows of 2 blocks = 136 bytes
        .tensor("v", &[3], 0, 192)
        .data(256)
        .clone();
    let mut g = g;
    g.align = 64;
    let h = g.parse().unwrap();
    assert_eq!(h.alignment, 64);
    assert_eq!(h.data_start % 64, 0);
    let w = h.tensor("w").unwrap();
    assert_eq!((w.ty, w.len, w.offset), (GgmlType::Q8_0, 136, h.data_start));
    assert_eq!(w.shape(), vec![2, 64]);
    assert_eq!(w.row_bytes(), 68);
    assert_eq!(h.tensor("v").unwrap().offset, h.data_start + 192);
}

#[test]
fn refuses_bad_magic_versions_and_endianness() {
    let mut bad = b().bytes();
    bad[0] = b'X';
    assert!(err(parse(&bad, bad.len() as u64, p())).contains("not a GGUF file"));
    let mut v = b();
    v.version = 1;
    refused(&v, "version 1");
    v.version = 4;
    refused(&v, "unsupported GGUF version 4");
    v.version = 3u32.swap_bytes();
    refused(&v, "big-endian");
    v.version = 0;
    refused(&v, "unsupported GGUF version 0");
    // Version 2 has the same layout as 3 and is read.
    v.version = 2;
    assert_eq!(
        v.tensor("t", &[8], 0, 0).data(32).parse().unwrap().version,
        2
    );
}

#[test]
fn refuses_counts_past_caps_and_past_the_bytes() {
    let mut x = b();
    x.n_t = MAX_TENSORS + 1;
    refused(&x, "tensors exceed");
    let mut x = b();
    x.n_kv = MAX_KV + 1;
    refused(&x, "metadata entries exceed");
    // Within the caps but more than the file can hold: refused before allocating.
    let mut x = b();
    x.n_kv = MAX_KV;
    refused(&x, "metadata entries needs");
    let mut x = b();
    x.n_t = MAX_TENSORS;
    refused(&x, "tensor infos needs");
    // An array longer than the cap, and one longer than the bytes left.
    let mut pl = 0u32.to_le_bytes().to_vec();
    pl.extend_from_slice(&(MAX_ARRAY_LEN + 1).to_le_bytes());
    refused(&b().kv("a", 9, &pl), "exceeds the");
    let mut pl = 6u32.to_le_bytes().to_vec();
    pl.extend_from_slice(&1_000_000u64.to_le_bytes());
    refused(&b().kv("a", 9, &pl), "array `a` of 1000000 elements needs");
    // A string longer than the cap, and one longer than the file.
    let mut pl = (MAX_STRING_LEN + 1).to_le_bytes().to_vec();
    pl.push(b'x');
    refused(&b().kv("s", 8, &pl), "GGUF key `s`: string of");
    let mut pl = 100u64.to_le_bytes().to_vec();
    pl.push(b'x');
    refused(&b().kv("s", 8, &pl), "value of `s` needs 100 bytes");
    // Name length past the cap.
    refused(
        &b().tensor(&"n".repeat(MAX_NAME_LEN as usize + 1), &[1], 0, 0),
        "exceeds the 1024",
    );
}

#[test]
fn a_file_without_tensors_need_not_be_padded() {
    let v = b().u32kv("k", 1).bytes();
    let unpadded = &v[..24 + 8 + 1 + 4 + 4];
    let g = parse(unpadded, unpadded.len() as u64, p()).unwrap();
    assert_eq!(g.data_start, unpadded.len() as u64);
    assert!(g.tensors.is_empty());
    // With a tensor the data section must be there.
    let v = b().tensor("t", &[1], 0, 0).bytes();
    let e = err(parse(&v[..v.len() - 4], v.len() as u64 - 4, p()));
    assert!(e.contains("starts past the end"), "{e}");
}

#[test]
fn refuses_malformed_metadata() {
    refused(
        &b().kv("k", 13, &[0]),
        "GGUF key `k`: unknown value type 13",
    );
    refused(&b().kv("k", 7, &[2]), "GGUF key `k`: boolean byte 2");
    refused(
        &b().kv("k", 8, &[1, 0, 0, 0, 0, 0, 0, 0, 0xff]),
        "not UTF-8",
    );
    refused(
        &b().u32kv("k", 1).u32kv("k", 2),
        "GGUF key `k`: key appears twice",
    );
    let mut pl = 99u32.to_le_bytes().to_vec();
    pl.extend_from_slice(&1u64.to_le_bytes());
    refused(&b().kv("a", 9, &pl), "unknown array element type 99");
    // Nesting: [[[[[u8]]]]] is 5 deep.
    let mut pl = Vec::new();
    for _ in 0..MAX_ARRAY_DEPTH {
        pl.extend_from_slice(&9u32.to_le_bytes());
        pl.extend_from_slice(&1u64.to_le_bytes());
    }
    pl.extend_from_slice(&0u32.to_le_bytes());
    pl.extend_from_slice(&1u64.to_le_bytes());
    pl.push(7);
    refused(&b().kv("deep", 9, &pl), "nested deeper");
    // One level less is accepted.
    assert!(b().kv("deep", 9, &pl[12..]).parse().is_ok());
    // Alignment: type and value.
    refused(&b().u32kv("general.alignment", 48), "not a power of two");
    refused(&b().u32kv("general.alignment", 0), "not a power of two");
    refused(
        &b().kv("general.alignment", 10, &64u64.to_le_bytes()),
        "is U64, not U32",
    );
}

#[test]
fn refuses_malformed_tensors() {
    let t = |dims: &[u64], ty: u32, off: u64| b().tensor("t", dims, ty, off).data(4096);
    refused(&t(&[], 0, 0), "GGUF tensor `t`: rank 0");
    refused(&t(&[1, 1, 1, 1, 1], 0, 0), "rank 5");
    refused(&t(&[1], 4, 0), "GGUF tensor `t`: unknown ggml type 4");
    refused(&t(&[1], 1000, 0), "unknown ggml type 1000");
    refused(
        &t(&[48], 8, 0),
        "row length 48 is not a multiple of the Q8_0 block size 32",
    );
    refused(&t(&[1 << 40, 1 << 40], 0, 0), "overflows");
    refused(&t(&[u64::MAX], 0, 0), "exceeds i64::MAX");
    // Found by the fuzz target: no elements, but a row whose byte size overflows.
    refused(&t(&[1 << 62, 0], 24 + 3, 0), "overflows");
    refused(&t(&[1 << 62, 0, 4], 0, 0), "overflows");
    refused(
        &t(&[1], 0, 8),
        "offset 8 is not a multiple of the alignment 32",
    );
    refused(
        &t(&[2048], 0, 0),
        "tensor `t`: data ends at 8192, past the 4096 bytes",
    );
    refused(&t(&[1], 0, u64::MAX - 31), "past the 4096 bytes");
    refused(
        &b().tensor("a", &[64], 0, 0)
            .tensor("b", &[8], 0, 224)
            .data(4096),
        "tensor `b` overlaps tensor `a`",
    );
    refused(
        &b().tensor("a", &[8], 0, 0)
            .tensor("a", &[8], 0, 32)
            .data(64),
        "GGUF tensor `a`: tensor name appears twice",
    );
    // Zero-sized tensors overlap nothing.
    assert!(
        b().tensor("a", &[0], 0, 0)
            .tensor("b", &[8], 0, 0)
            .data(32)
            .parse()
            .is_ok()
    );
}

#[test]
fn every_truncation_is_an_error_and_never_a_panic() {
    let v = std::fs::read(files().join("tiny.gguf")).unwrap();
    let full = parse(&v, v.len() as u64, p()).unwrap();
    let data_end = full.tensors.iter().map(|t| t.offset + t.len).max().unwrap();
    assert!(data_end > full.data_start);
    for n in 0..v.len() {
        // A file cut short of its last tensor's data: refused (past it only padding is lost).
        let cut = parse(&v[..n], n as u64, p());
        assert_eq!(cut.is_ok(), n as u64 >= data_end, "cut at {n}");
        // The whole file, only a prefix given: refused too, never a wrong header.
        if let Ok(g) = parse(&v[..n], v.len() as u64, p()) {
            assert_eq!(g, full, "prefix {n}");
        }
    }
}

#[test]
fn accessors_name_the_key_on_mismatch() {
    let g = b()
        .u32kv("a.u32", 7)
        .kv("a.str", 8, &{
            let mut v = vec![];
            s(&mut v, "hi");
            v
        })
        .kv("a.i32", 5, &(-1i32).to_le_bytes())
        .parse()
        .unwrap();
    assert_eq!(g.get_u32("a.u32").unwrap(), 7);
    assert_eq!(g.get_uint("a.u32").unwrap(), 7);
    assert_eq!(g.get_str("a.str").unwrap(), "hi");
    let e = g.get_str("a.u32").unwrap_err().to_string();
    assert_eq!(e, "x.gguf: GGUF key `a.u32`: is U32, not String");
    let e = g.get_u32("nope").unwrap_err().to_string();
    assert_eq!(e, "x.gguf: GGUF key `nope`: missing");
    assert!(
        g.get_uint("a.i32")
            .unwrap_err()
            .to_string()
            .contains("`a.i32`")
    );
    assert!(g.get_array("a.str").is_err());
}

fn files() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gguf/files")
}

#[test]
fn reads_what_gguf_writer_wrote_as_gguf_reader_does() {
    let expect: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(files().join("expect.json")).unwrap())
            .unwrap();
    let expect = expect.as_object().unwrap();
    assert_eq!(expect.len(), 4);
    for (name, want) in expect {
        let g = GgufFile::open(files().join(name)).unwrap().header;
        assert_eq!(g.version, 3, "{name}");
        assert_eq!(g.alignment, want["alignment"].as_u64().unwrap(), "{name}");
        assert_eq!(g.data_start, want["data_start"].as_u64().unwrap(), "{name}");
        let keys: Vec<(String, u64)> = g
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.value_type() as u64))
            .collect();
        let want_keys: Vec<(String, u64)> = want["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|kv| (kv[0].as_str().unwrap().to_owned(), kv[1].as_u64().unwrap()))
            .collect();
        assert_eq!(keys, want_keys, "{name}");
        let wt = want["tensors"].as_array().unwrap();
        assert_eq!(g.tensors.len(), wt.len(), "{name}");
        for (t, w) in g.tensors.iter().zip(wt) {
            assert_eq!(t.name, w["name"].as_str().unwrap(), "{name}");
            let dims: Vec<u64> = w["dims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(t.dims, dims, "{name} {}", t.name);
            assert_eq!(t.ty.id() as u64, w["type"].as_u64().unwrap());
            assert_eq!(t.offset, w["offset"].as_u64().unwrap(), "{name} {}", t.name);
            assert_eq!(t.len, w["len"].as_u64().unwrap(), "{name} {}", t.name);
        }
    }
}

#[test]
fn metadata_values_of_every_type() {
    let g = GgufFile::open(files().join("tiny.gguf")).unwrap().header;
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u8("t.u8").unwrap(), 200);
    assert_eq!(g.get_i8("t.i8").unwrap(), -100);
    assert_eq!(g.get_u16("t.u16").unwrap(), 60000);
    assert_eq!(g.get_i16("t.i16").unwrap(), -30000);
    assert_eq!(g.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(g.get_i32("t.i32").unwrap(), -2_000_000_000);
    assert_eq!(g.get_f32("t.f32").unwrap(), 0.1f32);
    assert_eq!(g.get_u64("t.u64").unwrap(), (1u64 << 63) + 5);
    assert_eq!(g.get_i64("t.i64").unwrap(), -(1i64 << 62));
    assert_eq!(g.get_f64("t.f64").unwrap(), -0.1f64);
    assert!(g.get_bool("t.bool").unwrap());
    assert_eq!(g.get_str("t.str").unwrap(), "héllo ✓");
    assert_eq!(
        g.get_array("t.arr_i32").unwrap(),
        &Array::I32(vec![1, -2, 3])
    );
    assert_eq!(g.get_str_array("t.arr_str").unwrap(), ["a", "", "ünï"]);
    assert_eq!(
        g.get_array("t.arr_f32").unwrap(),
        &Array::F32(vec![0.5, -1.25])
    );
    assert_eq!(
        g.get_array("t.arr_bool").unwrap(),
        &Array::Bool(vec![true, false])
    );
    assert_eq!(
        g.get_array("t.nested").unwrap(),
        &Array::Array(vec![Array::I32(vec![1, 2]), Array::I32(vec![3])])
    );
    assert_eq!(g.get_uint("llama.block_count").unwrap(), 2);
    let e = g.tensor("experts").unwrap();
    assert_eq!(
        (e.ty, e.dims.as_slice()),
        (GgmlType::IQ4_NL, &[32u64, 3, 2][..])
    );
}

#[test]
fn big_endian_file_is_refused() {
    let e = GgufFile::open(files().join("big-endian.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("big-endian.gguf: GGUF: big-endian"), "{e}");
}

#[test]
fn open_grows_its_read_past_one_mebibyte() {
    let dir = tempfile::tempdir().unwrap();
    let big = "x".repeat(3 << 20);
    let mut pl = Vec::new();
    s(&mut pl, &big);
    let v = b()
        .kv("big", 8, &pl)
        .tensor("t", &[4], 0, 0)
        .data(16)
        .bytes();
    let path = dir.path().join("big.gguf");
    std::fs::write(&path, &v).unwrap();
    let g = GgufFile::open(&path).unwrap().header;
    assert_eq!(g.get_str("big").unwrap().len(), 3 << 20);
    assert_eq!(g.tensor("t").unwrap().len, 16);
    // A header cut short inside a long file is still refused, naming the file.
    std::fs::write(&path, &v[..2 << 20]).unwrap();
    let e = GgufFile::open(&path).unwrap_err().to_string();
    assert!(
        e.contains("big.gguf: GGUF") && e.contains("truncated"),
        "{e}"
    );
}

#[test]
fn split_names() {
    assert_eq!(split_name("m-00001-of-00003.gguf"), Some(("m", 1, 3)));
    assert_eq!(split_name("a-b-00003-of-00003.gguf"), Some(("a-b", 3, 3)));
    assert_eq!(split_name("m-00004-of-00003.gguf"), None);
    assert_eq!(split_name("m-00000-of-00003.gguf"), None);
    assert_eq!(split_name("-00001-of-00003.gguf"), None);
    assert_eq!(split_name("m-0001-of-00003.gguf"), None);
    assert_eq!(split_name("m.gguf"), None);
    assert_eq!(split_name("m-00001-of-00003.bin"), None);
}

#[test]
fn opens_a_split_set_and_refuses_inconsistent_ones() {
    let set = GgufSet::open(files().join("split-00002-of-00002.gguf")).unwrap();
    assert_eq!(set.parts.len(), 2);
    assert_eq!(set.tensor_names().collect::<Vec<_>>(), ["t0", "t1", "t2"]);
    let (path, t) = set.tensor("t2").unwrap();
    assert!(path.ends_with("split-00002-of-00002.gguf"));
    assert_eq!(t.len, 16);
    assert_eq!(
        set.header().get_str("general.architecture").unwrap(),
        "llama"
    );
    let one = GgufSet::open(files().join("tiny.gguf")).unwrap();
    assert_eq!(one.parts.len(), 1);

    let dir = tempfile::tempdir().unwrap();
    let part = |no: u16, count: u16, total: i32, tensors: &[&str]| {
        let mut x = b()
            .kv("split.no", 2, &no.to_le_bytes())
            .kv("split.count", 2, &count.to_le_bytes())
            .kv("split.tensors.count", 5, &total.to_le_bytes());
        for (i, t) in tensors.iter().enumerate() {
            x = x.tensor(t, &[8], 0, 32 * i as u64);
        }
        x.data(32 * tensors.len()).bytes()
    };
    let w = |n: &str, v: Vec<u8>| std::fs::write(dir.path().join(n), v).unwrap();
    w("m-00001-of-00002.gguf", part(0, 2, 2, &["a"]));
    // Missing part.
    let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
    assert!(matches!(e, FormatError::MissingFile { .. }), "{e}");
    // A part that is a symlink loop is that, not missing (issue 59).
    let second = dir.path().join("m-00002-of-00002.gguf");
    std::os::unix::fs::symlink(&second, &second).unwrap();
    let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
    assert!(!matches!(e, FormatError::MissingFile { .. }), "{e}");
    assert!(
        e.to_string().contains("m-00002-of-00002.gguf") && e.to_string().contains("symbolic links"),
        "{e}"
    );
    std::fs::remove_file(&second).unwrap();
    // Wrong split.no.
    w("m-00002-of-00002.gguf", part(0, 2, 2, &["b"]));
    let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
    assert!(
        e.to_string()
            .contains("m-00002-of-00002.gguf: GGUF split: split.no 0"),
        "{e}"
    );
    // Tensor count disagreeing.
    w("m-00002-of-00002.gguf", part(1, 2, 3, &["b"]));
    let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
    assert!(e.to_string().contains("split.tensors.count 3"), "{e}");
    w("m-00002-of-00002.gguf", part(1, 2, 3, &["b", "c"]));
    w("m-00001-of-00002.gguf", part(0, 2, 3, &["a"]));
    assert!(GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).is_ok());
    w("m-00001-of-00002.gguf", part(0, 2, 4, &["a"]));
    w("m-00002-of-00002.gguf", part(1, 2, 4, &["b", "c"]));
    let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
    assert!(e.to_string().contains("the parts hold 3 tensors"), "{e}");
    // The same tensor in two parts.
    w("m-00001-of-00002.gguf", part(0, 2, 3, &["a"]));
    w("m-00002-of-00002.gguf", part(1, 2, 3, &["b", "a"]));
    let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
    assert!(e.to_string().contains("tensor `a` appears in both"), "{e}");
    // A file claiming to be split under a plain name.
    w("plain.gguf", part(0, 2, 3, &["a"]));
    let e = GgufSet::open(dir.path().join("plain.gguf")).unwrap_err();
    assert!(e.to_string().contains("split.count is 2"), "{e}");
}

#[test]
fn type_table_is_consistent() {
    let mut ids = std::collections::HashSet::new();
    for t in GgmlType::all() {
        assert!(ids.insert(t.id()), "{t} twice");
        assert_eq!(GgmlType::from_id(t.id()), Some(t));
        assert_eq!(TYPES.iter().filter(|r| r.0 == t).count(), 1, "{t}");
    }
    assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
    assert_eq!(GgmlType::Q4_K.bytes_for(500), None);
}
