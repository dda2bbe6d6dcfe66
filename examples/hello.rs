// hello.rs: one rank of a tpfabric host group from Rust, through the C ABI
// (<tpfabric/tpfabric.h>), with no crate: the declarations below are the
// part of the header it calls (bindgen would generate them all).
//
// Opens a group over the TCP bootstrap, runs an all-gather and an f32 sum,
// and checks both against a reference computed here from every rank's
// inputs, as hello.c does. Start WORLD copies, one per rank, against a
// running tpfabricd:
//
//   rustc --edition 2021 -O hello.rs $(pkg-config --libs-only-L libtpfabric) -o hello_rs
//   for r in 0 1 2; do ./hello_rs $r 3 127.0.0.1:29500 & done; wait
//
// (with cargo: the same `extern "C"` block, and `pkg_config::probe_library
// ("libtpfabric")` in build.rs). Exit status 0 when every check passed, 1 on
// any failure (printed), 2 on bad arguments. Rust 1.65 or later.
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::{c_char, c_void, CStr, CString};
use std::process::ExitCode;

#[repr(C)]
struct TpfGroup {
    _opaque: [u8; 0],
}
#[repr(C)]
struct TpfTcpBootstrap {
    _opaque: [u8; 0],
}
type TpfStatus = i32;
const TPF_OK: TpfStatus = 0;
const TPF_DTYPE_F32: i32 = 0;

#[repr(C)]
struct TpfOpenOptions {
    struct_size: u32,
    buffers: i32,
    socket_path: *const c_char,
    timeout_ms: u32,
    open_timeout_ms: u32,
    spin_us: u32,
    fallback: i32,
    gpu_route: i32,
    max_blocks: u32,
    nccl_comm: *mut c_void,
}

/// tpf_health: the group's health word as tpf_group_health reads it (32 bytes).
#[repr(C)]
struct TpfHealth {
    status: TpfStatus,
    rank: u32,
    flags: u32,
    reserved: [u32; 5],
}
const TPF_NO_RANK: u32 = u32::MAX;

type AllgatherFn = unsafe extern "C" fn(ctx: *mut c_void, mine: *const c_void, out: *mut c_void, bytes: usize) -> TpfStatus;

#[link(name = "tpfabric")]
extern "C" {
    fn tpf_open_options_init(options: *mut TpfOpenOptions);
    fn tpf_tcp_bootstrap_create(rank: u32, world: u32, addr: *const c_char, timeout_ms: u32,
                                boot: *mut *mut TpfTcpBootstrap) -> TpfStatus;
    fn tpf_tcp_bootstrap_destroy(boot: *mut TpfTcpBootstrap);
    fn tpf_tcp_bootstrap_allgather(ctx: *mut c_void, mine: *const c_void, out: *mut c_void, bytes: usize) -> TpfStatus;
    fn tpf_group_open(rank: u32, world: u32, max_bytes: u64, allgather: AllgatherFn, ctx: *mut c_void,
                      options: *const TpfOpenOptions, group: *mut *mut TpfGroup) -> TpfStatus;
    fn tpf_group_close(group: *mut TpfGroup);
    fn tpf_all_gather(group: *mut TpfGroup, send: *const c_void, recv: *mut c_void, bytes: usize) -> TpfStatus;
    fn tpf_all_reduce_sum(group: *mut TpfGroup, send: *const c_void, recv: *mut c_void, count: usize, dtype: i32)
        -> TpfStatus;
    fn tpf_check(group: *const TpfGroup) -> TpfStatus;
    fn tpf_group_health(group: *const TpfGroup, health: *mut TpfHealth) -> TpfStatus;
    fn tpf_fits(group: *const TpfGroup, bytes: usize) -> i32;
    fn tpf_agreed_cap(group: *const TpfGroup) -> u64;
    fn tpf_path(group: *const TpfGroup) -> *const c_char;
    fn tpf_route(group: *const TpfGroup, peer: u32) -> *const c_char;
    fn tpf_status_name(status: TpfStatus) -> *const c_char;
    fn tpf_last_error() -> *const c_char;
}

const GATHER_BYTES: usize = 4096;
const SUM_COUNT: usize = 1024;

// Every rank's inputs, so that any rank can compute the expected results.
fn gather_byte(rank: u32, i: usize) -> u8 {
    (rank as usize * 31 + i * 7) as u8
}
fn sum_input(rank: u32, i: usize) -> f32 {
    (((i * 13 + rank as usize * 29) % 101) as i32 - 50) as f32 * 0.37f32
}

fn text(p: *const c_char) -> String {
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

// "open: Unavailable: TPF_DISABLE=1 on rank 2 (Unavailable)": tpf_last_error() has the detail.
fn failed(what: &str, s: TpfStatus) -> String {
    unsafe { format!("{what}: {} ({})", text(tpf_last_error()), text(tpf_status_name(s))) }
}

/// Zeroed bytes on a 64-byte boundary (the library wants 16, else TPF_MISALIGNED).
struct Aligned {
    ptr: *mut u8,
    layout: Layout,
}
impl Aligned {
    fn new(bytes: usize) -> Aligned {
        let layout = Layout::from_size_align(bytes.max(1), 64).expect("a valid layout");
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, layout }
    }
    fn bytes(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
    fn floats(&mut self) -> &mut [f32] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut f32, self.layout.size() / 4) }
    }
}
impl Drop for Aligned {
    fn drop(&mut self) {
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// Closes the group when it goes out of scope.
struct Group(*mut TpfGroup);
impl Drop for Group {
    fn drop(&mut self) {
        unsafe { tpf_group_close(self.0) }
    }
}

fn run(rank: u32, world: u32, addr: &str, socket: Option<&str>) -> Result<String, String> {
    let addr = CString::new(addr).map_err(|_| "HOST:PORT has a NUL byte".to_string())?;
    let socket = socket.map(|s| CString::new(s).expect("a socket path without NUL bytes"));
    let mut options = std::mem::MaybeUninit::<TpfOpenOptions>::uninit();
    let mut options = unsafe {
        tpf_open_options_init(options.as_mut_ptr());
        options.assume_init()
    };
    if let Some(s) = &socket {
        options.socket_path = s.as_ptr(); // null: $TPF_SOCKET, else /run/tpfabric/tpfabricd.sock
    }

    // Rank 0 listens on HOST:PORT, the others connect. An engine passes its
    // own all-gather callback over its communicator or store instead.
    let mut boot = std::ptr::null_mut();
    let s = unsafe { tpf_tcp_bootstrap_create(rank, world, addr.as_ptr(), 0, &mut boot) };
    if s != TPF_OK {
        return Err(failed("bootstrap", s));
    }
    let mut raw = std::ptr::null_mut();
    let s = unsafe {
        tpf_group_open(rank, world, 64 * 1024, tpf_tcp_bootstrap_allgather, boot as *mut c_void, &options, &mut raw)
    };
    unsafe { tpf_tcp_bootstrap_destroy(boot) }; // only tpf_group_open uses the bootstrap
    if s != TPF_OK {
        return Err(failed("open", s));
    }
    let group = Group(raw);

    let mut send = Aligned::new(GATHER_BYTES);
    let mut recv = Aligned::new(world as usize * GATHER_BYTES);
    for (i, b) in send.bytes().iter_mut().enumerate() {
        *b = gather_byte(rank, i);
    }
    if unsafe { tpf_fits(group.0, GATHER_BYTES) } == 0 {
        // Above the cap a device group would call NCCL instead.
        return Err(format!("{GATHER_BYTES} B is above the agreed cap {} B", unsafe { tpf_agreed_cap(group.0) }));
    }
    let s = unsafe { tpf_all_gather(group.0, send.ptr as *const c_void, recv.ptr as *mut c_void, GATHER_BYTES) };
    if s != TPF_OK {
        return Err(failed("all-gather", s));
    }
    for (j, got) in recv.bytes().iter().enumerate() {
        let (r, i) = ((j / GATHER_BYTES) as u32, j % GATHER_BYTES);
        if *got != gather_byte(r, i) {
            return Err(format!("all-gather: byte {i} of rank {r}'s shard differs"));
        }
    }

    // f32 sum: added in rank order 0..W-1, so every rank gets the same bits.
    let mut input = Aligned::new(SUM_COUNT * 4);
    let mut output = Aligned::new(SUM_COUNT * 4);
    for (i, x) in input.floats().iter_mut().enumerate() {
        *x = sum_input(rank, i);
    }
    let s = unsafe {
        tpf_all_reduce_sum(group.0, input.ptr as *const c_void, output.ptr as *mut c_void, SUM_COUNT, TPF_DTYPE_F32)
    };
    if s != TPF_OK {
        return Err(failed("f32 sum", s));
    }
    for (i, got) in output.floats().iter().enumerate() {
        let mut want = sum_input(0, i);
        for r in 1..world {
            want += sum_input(r, i);
        }
        if got.to_bits() != want.to_bits() {
            return Err(format!("f32 sum: element {i} is {got:e}, expected {want:e}"));
        }
    }
    // The health word, once per step after the engine's own synchronisation
    // point (device groups: where the step's sampled tokens reach the host):
    // a few loads of host memory, no stream sync, no system call. A device
    // call that failed inside a kernel, also one replayed in a CUDA graph,
    // sets it before the kernel ends. When it is set, the outputs of the
    // failed call and every later one were not written: drop the step's
    // results, stop the other ranks (tpf_abort, or the engine's teardown),
    // then on every rank close, reopen, capture the graphs again and redo the
    // step; tpf_check (after synchronising) gives the detail.
    let mut health = TpfHealth { status: TPF_OK, rank: TPF_NO_RANK, flags: 0, reserved: [0; 5] };
    if unsafe { tpf_group_health(group.0, &mut health) } != TPF_OK {
        let named = if health.rank == TPF_NO_RANK { "no rank".to_string() } else { format!("rank {}", health.rank) };
        let name = text(unsafe { tpf_status_name(health.status) });
        return Err(format!("the group is broken: {name} naming {named}; reopen it on every rank: {}",
                           failed("check", unsafe { tpf_check(group.0) })));
    }
    // A failed call breaks the group: tpf_check says so; close it and open again.
    let s = unsafe { tpf_check(group.0) };
    if s != TPF_OK {
        return Err(failed("check", s));
    }

    let routes: Vec<String> = (0..world).map(|p| text(unsafe { tpf_route(group.0, p) })).collect();
    Ok(format!(
        "hello_rs: rank {rank} of {world}, path {} (routes {}): all-gather of {GATHER_BYTES} B ok, f32 sum of {SUM_COUNT} ok",
        text(unsafe { tpf_path(group.0) }),
        routes.join(" ")
    ))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let parsed = match args.len() {
        4 => Some(None),
        6 if args[4] == "--socket" => Some(Some(args[5].as_str())),
        _ => None,
    };
    let (rank, world) = (args.get(1).and_then(|a| a.parse().ok()), args.get(2).and_then(|a| a.parse().ok()));
    let (Some(socket), Some(rank), Some(world)) = (parsed, rank, world) else {
        eprintln!("usage: {} RANK WORLD HOST:PORT [--socket PATH]", args[0]);
        return ExitCode::from(2);
    };
    match run(rank, world, &args[3], socket) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hello_rs: {e}");
            ExitCode::from(1)
        }
    }
}
