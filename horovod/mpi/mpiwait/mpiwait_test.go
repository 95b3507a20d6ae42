package mpiwait

import (
	"strings"
	"testing"
)

func TestSleeping(t *testing.T) {
	for v, sleeping := range map[string]bool{"": true, "sleep": true, "spin": false} {
		t.Setenv(Env, v)
		got, err := FromEnv()
		if err != nil || got != sleeping {
			t.Errorf("%s=%q: sleeping wait %v, %v; want %v", Env, v, got, err, sleeping)
		}
	}
	for _, v := range []string{"poll", "Sleep", " spin", "1"} {
		if _, err := Sleeping(v); err == nil || !strings.Contains(err.Error(), `GOROVOD_MPI_WAIT="`+v+`": want sleep or spin`) {
			t.Errorf("%q gave %v", v, err)
		}
	}
}
