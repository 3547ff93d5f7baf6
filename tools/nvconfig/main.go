// Command nvconfig judges opaque device configs with NVIDIA's DRA driver's own API types
// (sigs.k8s.io/dra-driver-nvidia-gpu/api/nvidia.com/resource/v1beta1), the reference for
// webhook/dra/drivers/nvidia.py. Each input line is {"driver": ..., "parameters": {...},
// "gates": "Name=true,...", "uuids": [...]}; each output line is {"ok": bool, "error": "..."} after
// strict decoding, the kinds the driver's kubelet plugin accepts, Normalize(), Validate() and the
// prepare-time reads of the sharing settings (GetTimeSlicingConfig/GetMpsConfig, pinned-memory
// limits against the devices' UUIDs), as cmd/gpu-kubelet-plugin/device_state.go does.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"

	nvapi "sigs.k8s.io/dra-driver-nvidia-gpu/api/nvidia.com/resource/v1beta1"
	"sigs.k8s.io/dra-driver-nvidia-gpu/pkg/featuregates"
)

type input struct {
	Driver     string          `json:"driver"`
	Parameters json.RawMessage `json:"parameters"`
	Gates      string          `json:"gates"`
	// UUIDs of the devices the config is applied to (per-device pinned-memory keys are checked
	// against them, as at prepare time).
	UUIDs []string `json:"uuids"`
}

type output struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

func judge(in input) error {
	// Gates are process-wide: every line starts from the sharing gates off, then sets its own.
	gates := "TimeSlicingSettings=false,MPSSupport=false"
	if in.Gates != "" {
		gates += "," + in.Gates
	}
	if err := featuregates.FeatureGates().Set(gates); err != nil {
		return fmt.Errorf("gates: %w", err)
	}
	obj, err := runtime.Decode(nvapi.StrictDecoder, in.Parameters)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	var cfg nvapi.Interface
	switch c := obj.(type) {
	case *nvapi.GpuConfig, *nvapi.MigDeviceConfig, *nvapi.VfioDeviceConfig:
		if in.Driver != "gpu.nvidia.com" {
			return fmt.Errorf("kind %T is not a config of %s", obj, in.Driver)
		}
		cfg = c.(nvapi.Interface)
	case *nvapi.ComputeDomainChannelConfig, *nvapi.ComputeDomainDaemonConfig:
		if in.Driver != "compute-domain.nvidia.com" {
			return fmt.Errorf("kind %T is not a config of %s", obj, in.Driver)
		}
		cfg = c.(nvapi.Interface)
	default:
		return fmt.Errorf("not a recognized configuration type: %T", obj)
	}
	if err := cfg.Normalize(); err != nil {
		return fmt.Errorf("normalize: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("validate: %w", err)
	}
	var sharing nvapi.Sharing
	switch c := cfg.(type) {
	case *nvapi.GpuConfig:
		if c.Sharing != nil {
			sharing = c.Sharing
		}
	case *nvapi.MigDeviceConfig:
		if c.Sharing != nil {
			sharing = c.Sharing
		}
	}
	if sharing == nil {
		return nil
	}
	// applyConfig in cmd/gpu-kubelet-plugin/device_state.go reads the settings of the strategy.
	if featuregates.Enabled(featuregates.TimeSlicingSettings) && sharing.IsTimeSlicing() {
		if _, err := sharing.GetTimeSlicingConfig(); err != nil {
			return fmt.Errorf("prepare: %w", err)
		}
	}
	if featuregates.Enabled(featuregates.MPSSupport) && sharing.IsMps() {
		mps, err := sharing.GetMpsConfig()
		if err != nil {
			return fmt.Errorf("prepare: %w", err)
		}
		if mps != nil {
			if _, err := mps.DefaultPerDevicePinnedMemoryLimit.Normalize(in.UUIDs, mps.DefaultPinnedDeviceMemoryLimit); err != nil {
				return fmt.Errorf("prepare: %w", err)
			}
		}
	}
	return nil
}

func main() {
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	enc := json.NewEncoder(os.Stdout)
	for scanner.Scan() {
		var in input
		out := output{OK: true}
		if err := json.Unmarshal(scanner.Bytes(), &in); err != nil {
			out = output{Error: "input: " + err.Error()}
		} else if err := safeJudge(in); err != nil {
			out = output{Error: err.Error()}
		}
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := scanner.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// safeJudge turns a panic in the driver's code (a nil dereference on some inputs) into a verdict.
func safeJudge(in input) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return judge(in)
}
