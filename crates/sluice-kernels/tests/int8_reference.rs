//! The integer mode against its independent reference: `tools/reference/make_int8_fixtures.py`
//! implements the specification in NumPy (from docs/ARCHITECTURE.md and llama.cpp's reference
//! quantizers, reading the blocks by ggml's layouts) and wrote `testdata/int8/`; every ISA this
//! CPU has must give its bits, on gguf-py's blocks of every format with an integer product.

use std::path::{Path, PathBuf};

use sluice_kernels::gguf::BlockFormat;
use sluice_kernels::{Codes, Isa, Kernels, Matrix, Numerics};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn every_isa_gives_the_numpy_references_bits() {
    let manifest = std::fs::read_to_string(testdata().join("int8/manifest.txt")).unwrap();
    let mut formats = 0;
    for line in manifest.lines().filter(|l| !l.starts_with('#')) {
        let v: Vec<&str> = line.split_whitespace().collect();
        let name = v[0];
        let (rows, cols, acts): (usize, usize, usize) = (
            v[1].parse().unwrap(),
            v[2].parse().unwrap(),
            v[3].parse().unwrap(),
        );
        let f = (0..64)
            .filter_map(BlockFormat::from_ggml_id)
            .find(|f| format!("{f:?}") == name)
            .unwrap_or_else(|| panic!("{name}: not a block format"));
        let data = std::fs::read(testdata().join(format!("gguf/blocks/{name}.blocks"))).unwrap();
        let x = f32s(&testdata().join(format!("int8/{name}.acts")));
        let want = f32s(&testdata().join(format!("int8/{name}.out")));
        assert_eq!((x.len(), want.len()), (acts * cols, acts * rows), "{name}");
        let m = Matrix::dense(Codes::Block(f), &data, rows, cols).unwrap();
        for isa in Isa::available() {
            let k = Kernels::new(isa).unwrap().with_numerics(Numerics::Int8);
            let mut got = vec![0f32; acts * rows];
            k.matmul(&m, &x, &mut got, 0..rows);
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{name} {isa}: activation row {} weight row {}: {g} against {w}",
                    j / rows,
                    j % rows
                );
            }
        }
        formats += 1;
    }
    assert_eq!(formats, 11, "formats in testdata/int8/manifest.txt");
}
