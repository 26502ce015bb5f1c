//! The handlers against a fake XLA: an API table of our own that records the errors a handler
//! creates, and call frames built here. Covers what a real XLA rarely shows us: undersized
//! structs (an older or newer XLA), the metadata stage, the arity and attribute checks. (The
//! CPU test suite drives the same handlers through a real XLA:CPU.)

use std::cell::RefCell;
use std::ffi::{c_int, c_void, CStr};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::abi::{self, *};
use super::handlers;

thread_local! {
    static ERRORS: RefCell<Vec<(c_int, String)>> = const { RefCell::new(Vec::new()) };
}

static NEXT_ADDR: AtomicUsize = AtomicUsize::new(1 << 32);

/// A distinct non-null token per created error.
fn token() -> *mut abi::Error {
    Box::into_raw(Box::new(0u8)).cast()
}

unsafe extern "C" fn error_create(a: *mut ErrorCreateArgs) -> *mut abi::Error {
    let a = &*a;
    assert!(a.struct_size >= ERROR_CREATE_ARGS_SIZE);
    let msg = CStr::from_ptr(a.message).to_string_lossy().into_owned();
    ERRORS.with(|e| e.borrow_mut().push((a.errc, msg)));
    token()
}

unsafe extern "C" fn error_get_message(a: *mut ErrorGetMessageArgs) {
    (*a).message = c"no GPU context in this fake".as_ptr();
}

unsafe extern "C" fn error_destroy(a: *mut ErrorDestroyArgs) {
    drop(Box::from_raw((*a).error.cast::<u8>()));
}

unsafe extern "C" fn stream_get(a: *mut StreamGetArgs) -> *mut abi::Error {
    assert!((*a).struct_size >= STREAM_GET_ARGS_SIZE);
    token() // as XLA:CPU: no stream
}

fn api(struct_size: usize) -> Api {
    Api {
        struct_size,
        extension_start: null_mut(),
        api_version: ApiVersion {
            struct_size: API_VERSION_SIZE,
            extension_start: null_mut(),
            major_version: 0,
            minor_version: 1,
        },
        internal_api: null_mut(),
        error_create: Some(error_create),
        error_get_message: Some(error_get_message),
        error_destroy: Some(error_destroy),
        handler_register: null(),
        stream_get: Some(stream_get),
    }
}

/// A float16 buffer description at its own fake address (never read: there is no stream).
struct Buf {
    dims: Vec<i64>,
    raw: Buffer,
}

fn buf(dims: &[i64]) -> Buf {
    let mut b = Buf {
        dims: dims.to_vec(),
        raw: Buffer {
            struct_size: BUFFER_SIZE,
            extension_start: null_mut(),
            dtype: abi::dtype::F16,
            data: NEXT_ADDR.fetch_add(1 << 24, Ordering::Relaxed) as *mut c_void,
            rank: dims.len() as i64,
            dims: null(),
        },
    };
    b.raw.dims = b.dims.as_ptr(); // the Vec's heap block: stays put when `b` moves
    b
}

/// Owns everything a call frame points at.
struct Call {
    api: Api,
    args: Vec<Buf>,
    rets: Vec<Buf>,
    arg_types: Vec<c_int>,
    ret_types: Vec<c_int>,
    arg_ptrs: Vec<*mut c_void>,
    ret_ptrs: Vec<*mut c_void>,
    names: Vec<ByteSpan>,
    name_ptrs: Vec<*const ByteSpan>,
    scalars: Vec<Scalar>,
    values: Vec<f32>,
    attr_ptrs: Vec<*const c_void>,
    attr_types: Vec<c_int>,
}

impl Call {
    fn new(args: Vec<Buf>, rets: Vec<Buf>, attrs: &[(&'static str, f32)]) -> Call {
        let mut c = Call {
            api: api(API_SIZE),
            arg_types: vec![BUFFER; args.len()],
            ret_types: vec![BUFFER; rets.len()],
            args,
            rets,
            arg_ptrs: Vec::new(),
            ret_ptrs: Vec::new(),
            names: Vec::new(),
            name_ptrs: Vec::new(),
            scalars: Vec::new(),
            values: Vec::new(),
            attr_ptrs: Vec::new(),
            attr_types: Vec::new(),
        };
        c.arg_ptrs = c
            .args
            .iter_mut()
            .map(|b| (&mut b.raw as *mut Buffer).cast())
            .collect();
        c.ret_ptrs = c
            .rets
            .iter_mut()
            .map(|b| (&mut b.raw as *mut Buffer).cast())
            .collect();
        // filled completely before any pointer into them is taken (no reallocation after)
        c.values = attrs.iter().map(|(_, v)| *v).collect();
        c.names = attrs
            .iter()
            .map(|(n, _)| ByteSpan {
                ptr: n.as_ptr().cast(),
                len: n.len(),
            })
            .collect();
        c.scalars = c
            .values
            .iter()
            .map(|v| Scalar {
                dtype: abi::dtype::F32,
                value: (v as *const f32).cast(),
            })
            .collect();
        c.name_ptrs = c.names.iter().map(|n| n as *const ByteSpan).collect();
        c.attr_ptrs = c
            .scalars
            .iter()
            .map(|s| (s as *const Scalar).cast())
            .collect();
        c.attr_types = vec![ATTR_SCALAR; attrs.len()];
        c
    }

    fn frame(&self) -> CallFrame {
        CallFrame {
            struct_size: CALL_FRAME_SIZE,
            extension_start: null_mut(),
            api: &self.api,
            ctx: null_mut(),
            stage: STAGE_EXECUTE,
            args: Args {
                struct_size: ARGS_SIZE,
                extension_start: null_mut(),
                size: self.args.len() as i64,
                types: self.arg_types.as_ptr(),
                args: self.arg_ptrs.as_ptr(),
            },
            rets: Rets {
                struct_size: RETS_SIZE,
                extension_start: null_mut(),
                size: self.rets.len() as i64,
                types: self.ret_types.as_ptr(),
                rets: self.ret_ptrs.as_ptr(),
            },
            attrs: Attrs {
                struct_size: ATTRS_SIZE,
                extension_start: null_mut(),
                size: self.attr_types.len() as i64,
                types: self.attr_types.as_ptr(),
                names: self.name_ptrs.as_ptr(),
                attrs: self.attr_ptrs.as_ptr(),
            },
            future: null_mut(),
        }
    }
}

/// Runs `handler` on `frame`; the errors it created (code, message), each destroyed.
fn run(handler: abi::Handler, frame: &mut CallFrame) -> (bool, Vec<(c_int, String)>) {
    ERRORS.with(|e| e.borrow_mut().clear());
    // SAFETY: a complete frame whose pointers outlive the call.
    let err = unsafe { handler(frame) };
    let failed = !err.is_null();
    if failed {
        // SAFETY: our token.
        drop(unsafe { Box::from_raw(err.cast::<u8>()) });
    }
    (failed, ERRORS.with(|e| e.borrow().clone()))
}

const ATTN_ATTRS: &[(&str, f32)] = &[
    ("softcap", 0.0),
    ("softmax_scale", 0.25),
    ("window_left", -1.0),
    ("window_right", -1.0),
];

#[test]
fn answers_the_metadata_stage_with_version_0_1() {
    let call = Call::new(Vec::new(), Vec::new(), &[]);
    let mut md = Metadata {
        struct_size: METADATA_SIZE,
        api_version: ApiVersion {
            struct_size: API_VERSION_SIZE,
            extension_start: null_mut(),
            major_version: -1,
            minor_version: -1,
        },
        traits: 7,
    };
    let mut ext = MetadataExtension {
        extension_base: ExtensionBase {
            struct_size: METADATA_EXTENSION_SIZE,
            ext_type: EXTENSION_METADATA,
            next: null_mut(),
        },
        metadata: &mut md,
    };
    for (_, h) in super::TARGETS {
        let mut frame = call.frame();
        frame.extension_start = &mut ext.extension_base;
        let (failed, errors) = run(*h, &mut frame);
        assert!(!failed && errors.is_empty(), "{errors:?}");
        assert_eq!(
            (md.api_version.major_version, md.api_version.minor_version),
            (0, 1)
        );
        assert_eq!(md.traits, 0); // not command-buffer compatible
        md.traits = 7;
    }
}

#[test]
fn rejects_undersized_structs_by_name() {
    let call = Call::new(Vec::new(), Vec::new(), &[]);
    let mut frame = call.frame();
    frame.struct_size = 16;
    let (failed, errors) = run(handlers::flash_attn_fwd, &mut frame);
    assert!(failed);
    assert_eq!(errors[0].0, abi::code::INVALID_ARGUMENT);
    assert!(errors[0].1.contains("call frame of 16 bytes"), "{errors:?}");

    let mut old = Call::new(Vec::new(), Vec::new(), &[]);
    old.api.struct_size = 56; // an API table without XLA_FFI_Stream_Get
    let mut frame = old.frame();
    let (failed, errors) = run(handlers::flash_attn_fwd, &mut frame);
    assert!(failed);
    assert_eq!(errors[0].0, abi::code::UNIMPLEMENTED);
    assert!(errors[0].1.contains("API table is 56 bytes"), "{errors:?}");

    let mut small = Call::new(vec![buf(&[1, 4, 2, 16])], Vec::new(), &[]);
    small.args[0].raw.struct_size = 24;
    let mut frame = small.frame();
    let (_, errors) = run(handlers::flash_attn_fwd, &mut frame);
    assert!(
        errors[0].1.contains("buffer struct of 24 bytes"),
        "{errors:?}"
    );
}

#[test]
fn runs_the_ops_checks_without_a_stream() {
    // k's head dim differs from q's: the op's own message, as INVALID_ARGUMENT
    let q = || buf(&[1, 4, 2, 16]);
    let k = || buf(&[1, 4, 2, 8]);
    let call = Call::new(vec![q(), k(), k()], vec![q(), buf(&[1, 2, 4])], ATTN_ATTRS);
    let mut frame = call.frame();
    let (failed, errors) = run(handlers::flash_attn_fwd, &mut frame);
    assert!(failed);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, abi::code::INVALID_ARGUMENT);
    assert!(
        errors[0]
            .1
            .starts_with("flashscan flash_attn_fwd: k has shape"),
        "{errors:?}"
    );

    // valid input: the checks pass, then the missing stream is reported with XLA's reason
    // (the lse result is f16 here, so use f32 for it)
    let mut ok = Call::new(vec![q(), q(), q()], vec![q(), buf(&[1, 2, 4])], ATTN_ATTRS);
    ok.rets[1].raw.dtype = abi::dtype::F32;
    let mut frame = ok.frame();
    let (failed, errors) = run(handlers::flash_attn_fwd, &mut frame);
    assert!(failed);
    assert_eq!(errors[0].0, abi::code::UNAVAILABLE, "{errors:?}");
    assert!(
        errors[0]
            .1
            .contains("no CUDA stream: no GPU context in this fake"),
        "{errors:?}"
    );
}

#[test]
fn names_missing_attributes_and_wrong_arity() {
    let q = || buf(&[1, 4, 2, 16]);
    let call = Call::new(
        vec![q(), q(), q()],
        vec![q(), buf(&[1, 2, 4])],
        &ATTN_ATTRS[1..],
    );
    let mut frame = call.frame();
    let (_, errors) = run(handlers::flash_attn_fwd, &mut frame);
    assert!(
        errors[0].1.contains("attribute softcap is missing"),
        "{errors:?}"
    );

    let call = Call::new(vec![q(), q()], vec![q(), buf(&[1, 2, 4])], ATTN_ATTRS);
    let mut frame = call.frame();
    let (_, errors) = run(handlers::flash_attn_fwd, &mut frame);
    assert!(errors[0].1.contains("no operand v"), "{errors:?}");

    let call = Call::new(
        vec![q(), q(), q(), q()],
        vec![q(), buf(&[1, 2, 4])],
        ATTN_ATTRS,
    );
    let mut frame = call.frame();
    let (_, errors) = run(handlers::flash_attn_fwd, &mut frame);
    assert!(
        errors[0]
            .1
            .contains("called with 4 operands and 2 results, expected 3 and 2"),
        "{errors:?}"
    );
}

#[test]
fn backward_reads_the_forwards_attributes_then_deterministic() {
    let q = || buf(&[1, 4, 2, 16]);
    let operands = || vec![q(), q(), q(), q(), q(), buf(&[1, 2, 4])];
    let call = Call::new(operands(), vec![q(), q(), q()], &ATTN_ATTRS[1..]);
    let mut frame = call.frame();
    let (failed, errors) = run(handlers::flash_attn_bwd, &mut frame);
    assert!(failed);
    assert!(
        errors[0].1.contains("attribute softcap is missing"),
        "{errors:?}"
    );
    let call = Call::new(operands(), vec![q(), q(), q()], ATTN_ATTRS);
    let mut frame = call.frame();
    let (failed, errors) = run(handlers::flash_attn_bwd, &mut frame);
    assert!(failed);
    assert!(
        errors[0].1.contains("attribute deterministic is missing"),
        "{errors:?}"
    );
}
