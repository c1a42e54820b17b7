//! The simulated backend: GPUs from hardware profiles, MIG devices kept in memory and, with a
//! state file, on disk, so that a restarted plugin finds them as it would on a real GPU.
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use gpu_dra_api::config::TimeSliceInterval;

use gpu_dra_api::inventory::{Inventory, MigDevice, MigInfo};
use gpu_dra_api::profiles::{MediaEngines, MigProfile};
use gpu_dra_api::simulated::{GpuGroup, sim_mig_uuid, simulate_node};

use super::{ComputeMode, DeviceBackend, HealthEvent, HealthEventKind};
use crate::Error;

pub struct SimulatedBackend {
    inventory: Mutex<Inventory>,
    settings: Mutex<BTreeMap<u32, GpuSettings>>,
    health: Mutex<VecDeque<HealthEvent>>,
    health_ready: Condvar,
    /// Lines such as `gpu-3 xid 79`, `gpu-3 ecc`, `gpu-3 lost`, `gpu-3 healthy` appended to this
    /// file are picked up as health events (how tests inject faults into a running plugin).
    health_file: Option<PathBuf>,
    /// Where the MIG devices are kept across restarts (`with_mig_state_file`).
    mig_state_file: Option<PathBuf>,
}

/// The MIG devices of each GPU (by UUID), as the state file holds them.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct MigState {
    gpus: BTreeMap<String, Vec<MigDevice>>,
}

/// Sharing settings of one simulated GPU, as `nvidia-smi` would show them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSettings {
    pub time_slice: TimeSliceInterval,
    pub compute_mode: ComputeMode,
}

impl Default for GpuSettings {
    fn default() -> Self {
        GpuSettings {
            time_slice: TimeSliceInterval::Default,
            compute_mode: ComputeMode::Default,
        }
    }
}

impl SimulatedBackend {
    pub fn new(node: &str, groups: &[GpuGroup], mig_layout: Option<&str>) -> Result<Self, Error> {
        let inventory = simulate_node(node, groups, mig_layout)?;
        Ok(Self::from_inventory(inventory))
    }

    pub fn from_inventory(inventory: Inventory) -> Self {
        SimulatedBackend {
            inventory: Mutex::new(inventory),
            settings: Mutex::new(BTreeMap::new()),
            health: Mutex::new(VecDeque::new()),
            health_ready: Condvar::new(),
            health_file: None,
            mig_state_file: None,
        }
    }

    /// Keeps the MIG devices in `path`: those it holds replace the GPUs' devices now (a restart
    /// finds what the last run made), and every create and destroy rewrites it atomically.
    pub fn with_mig_state_file(mut self, path: PathBuf) -> Result<Self, Error> {
        match std::fs::read(&path) {
            Ok(bytes) => {
                let state: MigState = serde_json::from_slice(&bytes).map_err(|e| {
                    Error::Device(format!("simulated MIG state {}: {e}", path.display()))
                })?;
                let mut inv = self.inventory.lock().expect("inventory lock");
                for gpu in &mut inv.gpus {
                    if let (Some(mig), Some(devices)) =
                        (gpu.mig.as_mut(), state.gpus.get(&gpu.uuid))
                    {
                        mig.devices = devices.clone();
                        mig.enabled = !devices.is_empty();
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("reading", &path, e)),
        }
        self.mig_state_file = Some(path);
        Ok(self)
    }

    /// Writes the MIG devices to the state file, if there is one (under the inventory lock).
    fn persist(&self, inv: &Inventory) -> Result<(), Error> {
        let Some(path) = &self.mig_state_file else {
            return Ok(());
        };
        write_mig_state(path, inv)
    }
}

fn write_mig_state(path: &Path, inv: &Inventory) -> Result<(), Error> {
    let state = MigState {
        gpus: inv
            .gpus
            .iter()
            .filter_map(|g| Some((g.uuid.clone(), g.mig.as_ref()?.devices.clone())))
            .collect(),
    };
    let bytes = serde_json::to_vec_pretty(&state).expect("MIG state serializes");
    crate::fsutil::write_atomic(path, &bytes).map_err(|e| Error::io("writing", path, e))
}

impl SimulatedBackend {
    /// Also read injected health events from `path`.
    pub fn with_health_file(mut self, path: PathBuf) -> Self {
        self.health_file = Some(path);
        self
    }

    /// Queues a health event, as if the hardware had reported it.
    pub fn inject_health(&self, event: HealthEvent) {
        self.health.lock().expect("health lock").push_back(event);
        self.health_ready.notify_all();
    }

    pub fn settings(&self, gpu_minor: u32) -> GpuSettings {
        self.settings
            .lock()
            .expect("settings lock")
            .get(&gpu_minor)
            .copied()
            .unwrap_or_default()
    }

    fn gpu_exists(&self, gpu_minor: u32) -> Result<(), Error> {
        let inv = self.inventory.lock().expect("inventory lock");
        match inv.gpu_by_minor(gpu_minor) {
            Some(_) => Ok(()),
            None => Err(Error::Device(format!("no GPU with minor {gpu_minor}"))),
        }
    }

    /// Moves events written to the injection file into the queue; the file is emptied.
    fn read_health_file(&self) {
        let Some(path) = &self.health_file else {
            return;
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        if text.is_empty() {
            return;
        }
        let _ = std::fs::write(path, "");
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match parse_health_line(line) {
                Some(mut ev) => {
                    let inv = self.inventory.lock().expect("inventory lock");
                    ev.uuid = inv
                        .gpu_by_minor(ev.minor)
                        .map(|g| g.uuid.clone())
                        .unwrap_or_default();
                    drop(inv);
                    self.inject_health(ev)
                }
                None => tracing::warn!(line, "ignoring a malformed simulated health event"),
            }
        }
    }
}

/// Media engines are physical and shared by the GPU's instances: `+me` takes the one OFA engine,
/// `+me.all` every decoder and encoder. Refuses an instance the remaining engines cannot serve.
fn check_media_engines(mig: &MigInfo, profile: &MigProfile) -> Result<(), Error> {
    let existing = mig.devices.iter().map(|d| d.gi_profile_id);
    match MediaEngines::refusal(&mig.profiles, existing, profile) {
        None => Ok(()),
        Some(why) => Err(Error::Device(why)),
    }
}

/// `gpu-<minor> xid <code>` | `gpu-<minor> ecc` | `gpu-<minor> lost` | `gpu-<minor> unmonitored` |
/// `gpu-<minor> healthy`.
pub fn parse_health_line(line: &str) -> Option<HealthEvent> {
    let mut words = line.split_whitespace();
    let gpu_minor = words.next()?.strip_prefix("gpu-")?.parse().ok()?;
    let kind = match (words.next()?, words.next()) {
        ("xid", Some(code)) => HealthEventKind::Xid(code.parse().ok()?),
        ("ecc", None) => HealthEventKind::DoubleBitEcc,
        ("lost", None) => HealthEventKind::GpuLost,
        ("unmonitored", None) => HealthEventKind::Unmonitored,
        ("healthy", None) => HealthEventKind::Healthy,
        _ => return None,
    };
    words.next().is_none().then_some(HealthEvent {
        minor: gpu_minor,
        uuid: String::new(),
        kind,
        mig: None,
    })
}

impl DeviceBackend for SimulatedBackend {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    fn discover(&self) -> Result<Inventory, Error> {
        Ok(self.inventory.lock().expect("inventory lock").clone())
    }

    fn create_mig(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, Error> {
        let mut inv = self.inventory.lock().expect("inventory lock");
        let gpu = inv
            .gpus
            .iter_mut()
            .find(|g| g.minor == parent_minor)
            .ok_or_else(|| Error::Device(format!("no GPU with minor {parent_minor}")))?;
        let parent_uuid = gpu.uuid.clone();
        let mig = gpu
            .mig
            .as_mut()
            .ok_or_else(|| Error::Device(format!("gpu-{parent_minor} cannot do MIG")))?;
        let profile = mig
            .profiles
            .iter()
            .find(|p| p.gi_profile_id == gi_profile_id)
            .ok_or_else(|| {
                Error::Device(format!(
                    "gpu-{parent_minor} has no GI profile {gi_profile_id}"
                ))
            })?;
        if !profile
            .placements
            .iter()
            .any(|[s, _]| *s == placement_start)
        {
            return Err(Error::Device(format!(
                "{} cannot start at memory slice {placement_start}",
                profile.name
            )));
        }
        let size = profile.memory_slices;
        let wanted = placement_start..placement_start + size;
        if let Some(existing) = mig
            .devices
            .iter()
            .find(|d| d.placement_start == placement_start && d.gi_profile_id == gi_profile_id)
        {
            return Ok(existing.clone());
        }
        if let Some(clash) = mig.devices.iter().find(|d| {
            let other = d.placement_start..d.placement_start + d.placement_size;
            wanted.start < other.end && other.start < wanted.end
        }) {
            return Err(Error::Device(format!(
                "insufficient resources: placement {placement_start}+{size} overlaps {} at {}",
                clash.profile, clash.placement_start
            )));
        }
        check_media_engines(mig, profile)?;
        let same = mig
            .devices
            .iter()
            .filter(|d| d.gi_profile_id == gi_profile_id)
            .count();
        if same >= profile.max_instances as usize {
            return Err(Error::Device(format!(
                "insufficient resources: {} allows {} instances per GPU",
                profile.name, profile.max_instances
            )));
        }
        let used_compute: u32 = mig
            .devices
            .iter()
            .filter_map(|d| {
                mig.profiles
                    .iter()
                    .find(|p| p.gi_profile_id == d.gi_profile_id)
            })
            .map(|p| p.compute_slices)
            .sum();
        if used_compute + profile.compute_slices > mig.compute_slices {
            return Err(Error::Device(format!(
                "insufficient resources: {} needs {} compute slices, {} of {} are free",
                profile.name,
                profile.compute_slices,
                mig.compute_slices - used_compute,
                mig.compute_slices
            )));
        }
        let gi_id = (1..)
            .find(|id| !mig.devices.iter().any(|d| d.gi_id == *id))
            .expect("a free id");
        let device = MigDevice {
            profile: profile.name.clone(),
            gi_profile_id,
            placement_start,
            placement_size: size,
            uuid: sim_mig_uuid(&parent_uuid, gi_profile_id, placement_start),
            gi_id,
            ci_id: 0,
        };
        mig.enabled = true;
        mig.devices.push(device.clone());
        self.persist(&inv)?;
        Ok(device)
    }

    fn set_time_slice(&self, gpu_minor: u32, interval: TimeSliceInterval) -> Result<(), Error> {
        self.gpu_exists(gpu_minor)?;
        self.settings
            .lock()
            .expect("settings lock")
            .entry(gpu_minor)
            .or_default()
            .time_slice = interval;
        Ok(())
    }

    fn set_compute_mode(&self, gpu_minor: u32, mode: ComputeMode) -> Result<(), Error> {
        self.gpu_exists(gpu_minor)?;
        self.settings
            .lock()
            .expect("settings lock")
            .entry(gpu_minor)
            .or_default()
            .compute_mode = mode;
        Ok(())
    }

    fn health_events(&self, timeout: Duration) -> Result<Vec<HealthEvent>, Error> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            self.read_health_file();
            let mut q = self.health.lock().expect("health lock");
            if !q.is_empty() {
                return Ok(q.drain(..).collect());
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            // Poll the injection file at least every 200 ms.
            let wait = (deadline - now).min(Duration::from_millis(200));
            let (q, _) = self
                .health_ready
                .wait_timeout(q, wait)
                .expect("health lock");
            drop(q);
        }
    }

    fn destroy_mig(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<(), Error> {
        let mut inv = self.inventory.lock().expect("inventory lock");
        if let Some(mig) = inv
            .gpus
            .iter_mut()
            .find(|g| g.minor == parent_minor)
            .and_then(|g| g.mig.as_mut())
        {
            mig.devices.retain(|d| {
                !(d.placement_start == placement_start && d.gi_profile_id == gi_profile_id)
            });
            // Like Hopper+ under dynamic MIG: MIG mode goes off again with the last instance.
            if mig.devices.is_empty() {
                mig.enabled = false;
            }
        }
        self.persist(&inv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_devices_survive_a_restart_through_the_state_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mig.json");
        let groups = [GpuGroup::parse("h100-80gb:2").unwrap()];
        let start = || {
            SimulatedBackend::new("n", &groups, None)
                .unwrap()
                .with_mig_state_file(file.clone())
                .unwrap()
        };
        let b = start();
        let made = b.create_mig(1, 9, 4).unwrap();
        b.create_mig(1, 19, 0).unwrap();
        b.destroy_mig(1, 19, 0).unwrap();
        drop(b);
        let again = start().discover().unwrap();
        let mig = again.gpus[1].mig.as_ref().unwrap();
        assert_eq!(
            mig.devices,
            vec![made],
            "the 3g.40gb is still there, the 1g is not"
        );
        assert!(mig.enabled);
        assert!(!again.gpus[0].mig_enabled());
        let fresh = SimulatedBackend::new("n", &groups, None).unwrap();
        assert!(
            !fresh.discover().unwrap().gpus[1].mig_enabled(),
            "without the file nothing is kept"
        );
        std::fs::write(&file, "{not json").unwrap();
        let e = SimulatedBackend::new("n", &groups, None)
            .unwrap()
            .with_mig_state_file(file.clone())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("mig.json"), "{e}");
    }

    #[test]
    fn health_events_come_from_injection_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("health");
        let b = SimulatedBackend::new("n", &[GpuGroup::parse("h100-80gb:2").unwrap()], None)
            .unwrap()
            .with_health_file(file.clone());
        assert!(
            b.health_events(Duration::from_millis(10))
                .unwrap()
                .is_empty()
        );
        b.inject_health(HealthEvent {
            minor: 1,
            uuid: "GPU-1".into(),
            kind: HealthEventKind::GpuLost,
            mig: None,
        });
        std::fs::write(&file, "gpu-0 xid 79\nbogus line\ngpu-0 healthy\n").unwrap();
        let mut got = b.health_events(Duration::from_millis(500)).unwrap();
        if got.len() < 3 {
            got.extend(b.health_events(Duration::from_millis(500)).unwrap());
        }
        assert_eq!(got.len(), 3, "{got:?}");
        let kinds: Vec<_> = got.iter().map(|e| (e.minor, e.kind.clone())).collect();
        assert!(kinds.contains(&(0, HealthEventKind::Xid(79))), "{got:?}");
        assert!(kinds.contains(&(0, HealthEventKind::Healthy)), "{got:?}");
        let uuid0 = b.discover().unwrap().gpus[0].uuid.clone();
        assert!(
            got.iter().filter(|e| e.minor == 0).all(|e| e.uuid == uuid0),
            "events carry the GPU's UUID"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "", "consumed");
        assert_eq!(
            parse_health_line("gpu-2 ecc"),
            Some(HealthEvent {
                minor: 2,
                uuid: String::new(),
                kind: HealthEventKind::DoubleBitEcc,
                mig: None
            })
        );
        assert_eq!(parse_health_line("gpu-2 xid"), None);
        assert_eq!(parse_health_line("gpu-2 lost now"), None);
    }

    #[test]
    fn sharing_settings_are_recorded_per_gpu() {
        let b =
            SimulatedBackend::new("n", &[GpuGroup::parse("h100-80gb:2").unwrap()], None).unwrap();
        b.set_time_slice(1, TimeSliceInterval::Short).unwrap();
        b.set_compute_mode(1, ComputeMode::ExclusiveProcess)
            .unwrap();
        assert_eq!(
            b.settings(1),
            GpuSettings {
                time_slice: TimeSliceInterval::Short,
                compute_mode: ComputeMode::ExclusiveProcess
            }
        );
        assert_eq!(b.settings(0), GpuSettings::default());
        assert!(b.set_time_slice(7, TimeSliceInterval::Long).is_err());
    }

    #[test]
    fn mig_create_is_idempotent_refuses_overlaps_and_destroy_frees() {
        let b =
            SimulatedBackend::new("n", &[GpuGroup::parse("h100-80gb:1").unwrap()], None).unwrap();
        let a = b.create_mig(0, 9, 4).unwrap();
        assert_eq!(b.create_mig(0, 9, 4).unwrap(), a);
        let e = b.create_mig(0, 19, 5).unwrap_err().to_string();
        assert!(e.contains("overlaps"), "{e}");
        assert!(b.create_mig(0, 9, 3).is_err(), "not a valid placement");
        assert!(b.create_mig(3, 9, 0).is_err());
        b.destroy_mig(0, 19, 4).unwrap();
        assert_eq!(
            b.discover().unwrap().gpus[0]
                .mig
                .as_ref()
                .unwrap()
                .devices
                .len(),
            1,
            "another profile at that start stays"
        );
        b.destroy_mig(0, 9, 4).unwrap();
        b.destroy_mig(0, 9, 4).unwrap();
        b.create_mig(0, 19, 5).unwrap();
        assert_eq!(
            b.discover().unwrap().gpus[0]
                .mig
                .as_ref()
                .unwrap()
                .devices
                .len(),
            1
        );
    }

    #[test]
    fn mig_create_shares_the_media_engines() {
        let b =
            SimulatedBackend::new("n", &[GpuGroup::parse("rtx-pro-6000").unwrap()], None).unwrap();
        // RTX PRO 6000: 1g.24gb+me.all (GI 65) owns all 4 decoders; 1g.24gb (14) needs one,
        // 1g.24gb-me (67) none.
        b.create_mig(0, 65, 0).unwrap();
        let e = b.create_mig(0, 14, 1).unwrap_err().to_string();
        assert!(e.contains("decoders"), "{e}");
        b.create_mig(0, 67, 1).unwrap();
        b.destroy_mig(0, 65, 0).unwrap();
        b.create_mig(0, 14, 0).unwrap();
    }

    #[test]
    fn mig_create_enforces_instance_and_compute_limits_like_the_hardware() {
        let b =
            SimulatedBackend::new("n", &[GpuGroup::parse("h100-80gb:1").unwrap()], None).unwrap();
        // 1g.10gb+me (GI profile 20) takes the GPU's one OFA engine.
        b.create_mig(0, 20, 0).unwrap();
        let e = b.create_mig(0, 20, 1).unwrap_err().to_string();
        assert!(e.contains("ofa-engines"), "{e}");
        b.create_mig(0, 14, 2).unwrap(); // 2g.20gb: 3 of 7 compute slices used
        b.create_mig(0, 9, 4).unwrap(); // 3g.40gb: 6 of 7
        // 1g.10gb at 1 fits the memory slices but needs a 7th compute slice: fine; a second does not.
        b.create_mig(0, 19, 1).unwrap();
        b.destroy_mig(0, 19, 1).unwrap();
        let inv = b.discover().unwrap();
        assert!(inv.gpus[0].mig_enabled());
        for d in inv.gpus[0].mig.as_ref().unwrap().devices.clone() {
            b.destroy_mig(0, d.gi_profile_id, d.placement_start)
                .unwrap();
        }
        assert!(
            !b.discover().unwrap().gpus[0].mig_enabled(),
            "MIG mode goes off with the last instance"
        );
    }
}
