//! Kernel sources as NVRTC sees them: a family file (`cuda/<family>.cu`) with its
//! `#include "common/<x>.cuh"` lines replaced by the text of the embedded headers.
//!
//! The headers are compiled into the crate (`include_str!`), so a wheel needs no file next to it,
//! and they are inlined into the translation unit rather than handed to NVRTC as named headers, so
//! the disk-cache key (a hash of the translation unit, `cache::key`) covers every header's bytes.
//! Each header is inlined once per translation unit, at its first `#include` (the headers carry
//! `#pragma once` for compilers that read them from disk, e.g. `nvcc -I cuda`); `#line` directives
//! keep NVRTC's diagnostics naming `common/x.cuh:LINE` and `family.cu:LINE`. Include paths are
//! relative to `cuda/`. Only embedded headers may be included: a toolkit header (`<cuda_fp16.h>`)
//! or an unknown name is an error, never a silent miss.

use crate::error::{Error, Result};

/// Every header a kernel source may include, by its path relative to `cuda/`.
pub const HEADERS: &[(&str, &str)] = &[
    (
        "common/types.cuh",
        include_str!("../../cuda/common/types.cuh"),
    ),
    (
        "common/convert.cuh",
        include_str!("../../cuda/common/convert.cuh"),
    ),
    (
        "common/copy.cuh",
        include_str!("../../cuda/common/copy.cuh"),
    ),
    (
        "common/math.cuh",
        include_str!("../../cuda/common/math.cuh"),
    ),
    ("common/mma.cuh", include_str!("../../cuda/common/mma.cuh")),
    (
        "common/wgmma.cuh",
        include_str!("../../cuda/common/wgmma.cuh"),
    ),
    ("common/tma.cuh", include_str!("../../cuda/common/tma.cuh")),
    (
        "common/softcap.cuh",
        include_str!("../../cuda/common/softcap.cuh"),
    ),
    ("common/ssd.cuh", include_str!("../../cuda/common/ssd.cuh")),
    (
        "common/ssd_tiles.cuh",
        include_str!("../../cuda/common/ssd_tiles.cuh"),
    ),
    (
        "common/flash_params.cuh",
        include_str!("../../cuda/common/flash_params.cuh"),
    ),
    (
        "common/opaque.cuh",
        include_str!("../../cuda/common/opaque.cuh"),
    ),
];

/// `source` (shown as `file` in diagnostics) with every `#include "..."` resolved from `headers`.
pub fn expand(file: &str, source: &str, headers: &[(&str, &str)]) -> Result<String> {
    let mut out =
        String::with_capacity(source.len() + headers.iter().map(|h| h.1.len()).sum::<usize>());
    let mut seen: Vec<&str> = Vec::new();
    expand_into(&mut out, file, source, headers, &mut seen)?;
    Ok(out)
}

fn expand_into<'h>(
    out: &mut String,
    file: &str,
    source: &str,
    headers: &[(&'h str, &'h str)],
    seen: &mut Vec<&'h str>,
) -> Result<()> {
    out.push_str(&format!("#line 1 \"{file}\"\n"));
    for (i, line) in source.lines().enumerate() {
        let Some(target) = include_target(line) else {
            // `#pragma once` would make NVRTC warn in what is, to it, the main file.
            out.push_str(if line.trim() == "#pragma once" {
                ""
            } else {
                line
            });
            out.push('\n');
            continue;
        };
        let unknown = |why: &str| Error::Compile {
            what: file.to_string(),
            log: format!("{file}:{}: `{}`: {why}", i + 1, line.trim()),
        };
        let quoted = target.strip_prefix('"').and_then(|t| t.split_once('"'));
        let Some((path, _)) = quoted else {
            return Err(unknown(
                "only the embedded kernel headers may be included (\"common/x.cuh\"), \
                 never toolkit or system headers",
            ));
        };
        let Some(&(name, text)) = headers.iter().find(|(n, _)| *n == path) else {
            let known: Vec<&str> = headers.iter().map(|h| h.0).collect();
            return Err(unknown(&format!(
                "no embedded kernel header named \"{path}\" (known: {})",
                known.join(", ")
            )));
        };
        if !seen.contains(&name) {
            seen.push(name);
            expand_into(out, name, text, headers, seen)?;
        }
        // The include line itself becomes the directive: the next line keeps its number.
        out.push_str(&format!("#line {} \"{file}\"\n", i + 2));
    }
    Ok(())
}

/// What follows `#include` on a preprocessor line, if it is one.
fn include_target(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix('#')?.trim_start();
    Some(rest.strip_prefix("include")?.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;

    /// Every family source the ops embed, as (file name, text).
    fn families() -> Vec<(String, &'static str)> {
        let mut v: Vec<(String, &'static str)> = ops::all_variants(90)
            .into_iter()
            .map(|(s, _)| (format!("{}.cu", s.family), s.source))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Walks a translation unit and checks that every line stands at the place its last `#line`
    /// directive claims: line N of file F is line N of F's text.
    fn check_line_directives(tu: &str, files: &[(&str, &str)]) {
        let (mut file, mut next) = ("", 0usize);
        for line in tu.lines() {
            if let Some(rest) = line.strip_prefix("#line ") {
                let (n, f) = rest.split_once(' ').expect("#line N \"file\"");
                next = n.parse().expect("line number");
                file = f.trim_matches('"');
                continue;
            }
            let text = files
                .iter()
                .find(|(n, _)| *n == file)
                .unwrap_or_else(|| panic!("{file} not known"))
                .1;
            let want = text.lines().nth(next - 1).expect("line inside the file");
            let want = if want.trim() == "#pragma once" {
                ""
            } else {
                want
            };
            assert_eq!(line, want, "{file}:{next}");
            next += 1;
        }
    }

    #[test]
    fn every_family_expands_each_header_once_with_right_lines() {
        for (file, src) in families() {
            let tu = expand(&file, src, HEADERS).expect("expands");
            assert!(!tu.contains("#include"), "{file}: an include was left");
            assert!(
                !tu.contains("#pragma once"),
                "{file}: #pragma once was left"
            );
            assert!(src.contains("#include \"common/"), "{file}: uses no header");
            for (name, _) in HEADERS {
                let opened = tu.matches(&format!("#line 1 \"{name}\"\n")).count();
                assert!(opened <= 1, "{file}: {name} inlined {opened} times");
            }
            let mut files: Vec<(&str, &str)> = HEADERS.to_vec();
            files.push((&file, src));
            check_line_directives(&tu, &files);
        }
    }

    #[test]
    fn line_directives_resume_after_each_header() {
        let headers: &[(&str, &str)] = &[
            ("common/a.cuh", "#pragma once\nint a;\n"),
            (
                "common/b.cuh",
                "#pragma once\n#include \"common/a.cuh\"\nint b;\n",
            ),
        ];
        let src = "// k\n#include \"common/b.cuh\"\n  #  include \"common/a.cuh\"\nint k;\n";
        let tu = expand("k.cu", src, headers).expect("expands");
        let want = "#line 1 \"k.cu\"\n// k\n\
                    #line 1 \"common/b.cuh\"\n\n\
                    #line 1 \"common/a.cuh\"\n\nint a;\n\
                    #line 3 \"common/b.cuh\"\nint b;\n\
                    #line 3 \"k.cu\"\n\
                    #line 4 \"k.cu\"\nint k;\n";
        assert_eq!(tu, want);
    }

    #[test]
    fn unknown_or_toolkit_include_is_an_error() {
        for (src, needle) in [
            ("int x;\n#include \"common/nope.cuh\"\n", "k.cu:2"),
            ("#include <cuda_fp16.h>\n", "toolkit"),
            ("#include \"common/types.cuh\n", "k.cu:1"),
        ] {
            match expand("k.cu", src, HEADERS) {
                Err(Error::Compile { what, log }) => {
                    assert_eq!(what, "k.cu");
                    assert!(log.contains(needle), "{log}");
                }
                other => panic!("expected a compile error, got {other:?}"),
            }
        }
        // An unknown include inside a header names the header.
        let headers: &[(&str, &str)] = &[("common/a.cuh", "#include \"common/zz.cuh\"\n")];
        let err = expand("k.cu", "#include \"common/a.cuh\"\n", headers).unwrap_err();
        assert!(err.to_string().contains("common/a.cuh:1"), "{err}");
    }

    #[test]
    fn translation_unit_and_cache_key_follow_header_bytes() {
        let key = |tu: &str| super::super::cache::key(tu, &[], (13, 0), "sm_90a");
        for (file, src) in families() {
            let base = expand(&file, src, HEADERS).expect("expands");
            for (i, (name, _)) in HEADERS.iter().enumerate() {
                if !base.contains(&format!("#line 1 \"{name}\"")) {
                    continue;
                }
                let mut edited: Vec<(&str, String)> =
                    HEADERS.iter().map(|(n, t)| (*n, t.to_string())).collect();
                edited[i].1.push_str("// one more byte\n");
                let edited: Vec<(&str, &str)> =
                    edited.iter().map(|(n, t)| (*n, t.as_str())).collect();
                let changed = expand(&file, src, &edited).expect("expands");
                assert_ne!(base, changed, "{file}: {name}");
                assert_ne!(key(&base), key(&changed), "{file}: {name}");
            }
        }
    }
}
