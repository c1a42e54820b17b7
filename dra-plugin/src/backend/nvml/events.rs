//! Health events: XID and double-bit ECC errors from NVML's event set, and lost GPUs.
use std::time::Duration;

use dra_plugin_core::Error;
use dra_plugin_core::backend::{HealthEvent, HealthEventKind};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use tracing::warn;

use super::{CachedGpu, NvmlBackend, Raw, Session, Status, func, raw_err};

/// The event set every GPU is registered with (once, on the first wait).
pub(super) struct Events {
    set: Raw<sys::nvmlEventSet_t>,
}

impl NvmlBackend {
    /// Waits up to `timeout` for events; registers for them on the first call.
    pub(super) fn wait_health_events(&self, timeout: Duration) -> Result<Vec<HealthEvent>, Error> {
        let s = self.session()?;
        let mut events = self.events.lock().expect("events lock");
        let mut out = Vec::new();
        if events.is_none() {
            *events = Some(self.register_events(&s, &mut out)?);
        }
        let set = events.as_ref().expect("just set").set;
        let wait = func(&s.lib().nvmlEventSetWait_v2, "nvmlEventSetWait_v2")?;
        let mut ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        loop {
            // SAFETY: zeroed out-struct, event set from this session.
            let mut data: sys::nvmlEventData_t = unsafe { std::mem::zeroed() };
            match Status::ok(unsafe { wait(set.0, &mut data, ms) }) {
                Ok(()) => {
                    let Some(g) = s.gpus.iter().find(|g| g.handle.0 == data.device) else {
                        continue;
                    };
                    let kind = match data.eventType {
                        t if t == u64::from(sys::nvmlEventTypeXidCriticalError) => {
                            HealthEventKind::Xid(data.eventData)
                        }
                        t if t == u64::from(sys::nvmlEventTypeDoubleBitEccError) => {
                            HealthEventKind::DoubleBitEcc
                        }
                        _ => continue,
                    };
                    let mig = (data.gpuInstanceId != u32::MAX
                        && data.computeInstanceId != u32::MAX)
                        .then_some((data.gpuInstanceId, data.computeInstanceId));
                    out.push(HealthEvent {
                        minor: g.minor,
                        uuid: g.uuid.clone(),
                        kind,
                        mig,
                    });
                    ms = 0; // drain what is queued, then return
                }
                Err(st) if st.is(sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT) => return Ok(out),
                Err(st) if st.is(sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST) => {
                    let lost: Vec<&CachedGpu> = s
                        .gpus
                        .iter()
                        .filter(|g| matches!(s.device(g).uuid(), Err(NvmlError::GpuLost)))
                        .collect();
                    // NVML did not say which: all of them are suspect.
                    let lost = if lost.is_empty() {
                        s.gpus.iter().collect()
                    } else {
                        lost
                    };
                    out.extend(lost.into_iter().map(|g| HealthEvent {
                        minor: g.minor,
                        uuid: g.uuid.clone(),
                        kind: HealthEventKind::GpuLost,
                        mig: None,
                    }));
                    return Ok(out);
                }
                Err(st) => return Err(raw_err("waiting for events")(st)),
            }
        }
    }

    fn register_events(&self, s: &Session, early: &mut Vec<HealthEvent>) -> Result<Events, Error> {
        let lib = s.lib();
        let create = func(&lib.nvmlEventSetCreate, "nvmlEventSetCreate")?;
        let supported = func(
            &lib.nvmlDeviceGetSupportedEventTypes,
            "nvmlDeviceGetSupportedEventTypes",
        )?;
        let register = func(&lib.nvmlDeviceRegisterEvents, "nvmlDeviceRegisterEvents")?;
        let mut set: sys::nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: out-pointer.
        Status::ok(unsafe { create(&mut set) }).map_err(raw_err("creating an event set"))?;
        let wanted =
            u64::from(sys::nvmlEventTypeXidCriticalError | sys::nvmlEventTypeDoubleBitEccError);
        for g in &s.gpus {
            let mut types = 0u64;
            // SAFETY: valid handle and out-pointer.
            let r = Status::ok(unsafe { supported(g.handle.0, &mut types) })
                .and_then(|_| Status::ok(unsafe { register(g.handle.0, types & wanted, set) }));
            match r {
                Ok(()) => {}
                Err(st) if st.is(sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST) => {
                    early.push(HealthEvent {
                        minor: g.minor,
                        uuid: g.uuid.clone(),
                        kind: HealthEventKind::GpuLost,
                        mig: None,
                    });
                }
                Err(st) => {
                    warn!(gpu = g.minor, error = %st, "cannot watch this GPU's health");
                    early.push(HealthEvent {
                        minor: g.minor,
                        uuid: g.uuid.clone(),
                        kind: HealthEventKind::Unmonitored,
                        mig: None,
                    });
                }
            }
        }
        Ok(Events { set: Raw(set) })
    }
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        if let (Ok(Some(ev)), Ok(Some(s))) = (self.events.get_mut(), self.session.get_mut())
            && let Ok(free) = s.lib().nvmlEventSetFree.as_ref()
        {
            // SAFETY: the set belongs to this session and is not used after this.
            unsafe { free(ev.set.0) };
        }
    }
}
