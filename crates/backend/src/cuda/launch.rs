//! Launching our kernels: every one with programmatic dependent launch
//! (Hopper and later), so that it may start while the kernel before it
//! still runs. Each kernel calls `pdl_wait()` (kernels/common.cuh) before it
//! touches anything but weights, which `compile`'s tests check in the source.

use cudarc::driver::{sys, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, LaunchConfig};
use ferrite_core::Result;

use super::device::{device_err, Device};

/// A launch's kernel arguments, each in an 8-byte slot: the driver reads a
/// parameter's size from the start of its slot, so a 4-byte value in the low
/// half is passed as itself (little-endian hosts).
#[derive(Default)]
struct KernelArgs {
    /// Room for the longest parameter list (the mixed q/k/v GEMV with
    /// RoPE's 29).
    slots: [u64; MAX_ARGS],
    n: usize,
}

const MAX_ARGS: usize = 32;

#[cfg(target_endian = "big")]
compile_error!("KernelArgs passes 4-byte arguments in the low half of 8-byte slots");

/// A value `Launch::arg` takes: a device buffer (its address) or a scalar.
pub trait KernelArg {
    fn slot(self, stream: &CudaStream) -> u64;
}

impl<T> KernelArg for &CudaSlice<T> {
    fn slot(self, stream: &CudaStream) -> u64 {
        self.device_ptr(stream).0
    }
}

impl<T> KernelArg for &mut CudaSlice<T> {
    fn slot(self, stream: &CudaStream) -> u64 {
        self.device_ptr_mut(stream).0
    }
}

impl<T> KernelArg for &CudaView<'_, T> {
    fn slot(self, stream: &CudaStream) -> u64 {
        self.device_ptr(stream).0
    }
}

/// A scalar argument's slot value: a 4-byte one in the low half.
trait ScalarSlot {
    fn slot_value(self) -> u64;
}

/// Scalars are kernel arguments by value and by reference.
macro_rules! scalar_arg {
    ($t:ty, $slot:expr) => {
        impl ScalarSlot for $t {
            fn slot_value(self) -> u64 {
                $slot(self)
            }
        }
        impl KernelArg for $t {
            fn slot(self, _: &CudaStream) -> u64 {
                self.slot_value()
            }
        }
        impl KernelArg for &$t {
            fn slot(self, _: &CudaStream) -> u64 {
                (*self).slot_value()
            }
        }
    };
}
scalar_arg!(u64, |v: u64| v);
scalar_arg!(u32, |v: u32| v as u64);
scalar_arg!(i32, |v: i32| v as u32 as u64);
scalar_arg!(f32, |v: f32| v.to_bits() as u64);

/// One launch of one of our kernels, built argument by argument (in the
/// kernel's order) and run with `Device::launch_pdl`.
pub struct Launch<'a> {
    dev: &'a Device,
    name: &'a str,
    args: KernelArgs,
}

impl Launch<'_> {
    pub fn arg(&mut self, a: impl KernelArg) -> &mut Self {
        let v = a.slot(&self.dev.stream);
        self.args.push(v);
        self
    }

    pub fn run(&self, cfg: LaunchConfig) -> Result<()> {
        self.dev.launch_pdl(self.name, cfg, &self.args)
    }
}

impl KernelArgs {
    fn push(&mut self, v: u64) {
        assert!(self.n < MAX_ARGS, "a kernel with more than {MAX_ARGS} parameters");
        self.slots[self.n] = v;
        self.n += 1;
    }
}

impl Device {
    /// A launch of kernel `name`, arguments to follow.
    pub fn launch<'a>(&'a self, name: &'a str) -> Launch<'a> {
        Launch { dev: self, name, args: KernelArgs::default() }
    }

    /// Launches `name`, a kernel that calls `pdl_wait()` (kernels/common.cuh)
    /// before it touches anything but weights, so that it may start while the
    /// kernel before it still runs.
    fn launch_pdl(&self, name: &str, cfg: LaunchConfig, args: &KernelArgs) -> Result<()> {
        let mut slots = args.slots;
        let mut params: [*mut std::ffi::c_void; MAX_ARGS] =
            std::array::from_fn(|i| (&mut slots[i]) as *mut u64 as *mut _);
        // SAFETY: an all-zero attribute is valid; then its id and value are set.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: self.pdl as u32,
        };
        self.ctx.bind_to_thread().map_err(|e| device_err(name, e))?;
        // SAFETY: the caller passes the kernel's parameters in order, and
        // every slot outlives the call.
        unsafe {
            sys::cuLaunchKernelEx(&config, self.func(name).cu_function(), params.as_mut_ptr(), std::ptr::null_mut())
        }
        .result()
        .map_err(|e| device_err(name, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver reads a 4-byte parameter from the start of its slot.
    #[test]
    fn four_byte_arguments_sit_at_the_start_of_their_slots() {
        let mut a = KernelArgs::default();
        for v in [7u32.slot_value(), (-3i32).slot_value(), (u64::MAX - 1).slot_value()] {
            a.push(v);
        }
        let read4 = |i: usize| {
            // SAFETY: reads the first 4 of the slot's 8 bytes, as the driver does.
            unsafe { *(&a.slots[i] as *const u64 as *const i32) }
        };
        assert_eq!((read4(0), read4(1), a.slots[2], a.n), (7, -3, u64::MAX - 1, 3));
    }
}
