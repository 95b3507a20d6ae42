package backend

import (
	"errors"
	"slices"
	"testing"
)

func TestRegisterAndLookup(t *testing.T) {
	opened := errors.New("opened")
	var got DriverConfig
	Register("test-driver", func(cfg DriverConfig) (Backend, error) { got = cfg; return nil, opened })
	d, ok := Lookup("test-driver")
	if !ok {
		t.Fatal("a registered driver is not found")
	}
	if _, err := d(DriverConfig{Wait: WaitSpin}); err != opened || got.Wait != WaitSpin {
		t.Errorf("the driver found is not the one registered: %v, %+v", err, got)
	}
	if _, ok := Lookup("no-such-driver"); ok {
		t.Error("an unregistered driver is found")
	}
	if !slices.Contains(Drivers(), "test-driver") {
		t.Errorf("Drivers() = %v", Drivers())
	}
}

// Registering a name twice, or a nil driver, panics as database/sql's Register does.
func TestRegisterPanics(t *testing.T) {
	Register("twice", func(DriverConfig) (Backend, error) { return nil, nil })
	for name, register := range map[string]func(){
		"twice": func() { Register("twice", func(DriverConfig) (Backend, error) { return nil, nil }) },
		"nil":   func() { Register("nil-driver", nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			register()
		}()
	}
}

func TestWaitString(t *testing.T) {
	if WaitSleep.String() != "sleep" || WaitSpin.String() != "spin" || Wait(7).String() != "Wait(7)" {
		t.Errorf("%v %v %v", WaitSleep, WaitSpin, Wait(7))
	}
}
