/* The C shim between the Fortran model and Python: embeds CPython and calls bridge.py.
 *
 * Four functions with C binding, each returning 0 on success and 1 when Python raised (the
 * traceback is printed first). Arrays travel as addresses, never copied.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fenv.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static PyObject *session = NULL; /* the bridge.Session of this process */

static int report(PyObject *result)
{
    if (result == NULL) {
        PyErr_Print();
        return 1;
    }
    Py_DECREF(result);
    return 0;
}

static int start(int comm, int nlat, int nlon, int npolar, int nazimuth, int lat_first, int lat_last,
                 int lon_first, int lon_last);

int mps_start(int comm, int nlat, int nlon, int npolar, int nazimuth, int lat_first, int lat_last,
              int lon_first, int lon_last)
{
    /* The model's floating-point traps stay off while Python starts and imports NumPy (NumPy 2.2's import
       computes float limits that trap; 2.4's does not), and are back on for every mpisphere call. */
    fenv_t traps;
    feholdexcept(&traps);
    int status = start(comm, nlat, nlon, npolar, nazimuth, lat_first, lat_last, lon_first, lon_last);
    feclearexcept(FE_ALL_EXCEPT);
    fesetenv(&traps);
    return status;
}

static int start(int comm, int nlat, int nlon, int npolar, int nazimuth, int lat_first, int lat_last,
                 int lon_first, int lon_last)
{
    if (!Py_IsInitialized()) {
        /* MPS_PYTHON names the interpreter (a virtual environment's python): started as that program,
           the embedded Python finds that environment's site-packages, editable installs included. */
        PyConfig config;
        PyConfig_InitPythonConfig(&config);
        const char *program = getenv("MPS_PYTHON");
        PyStatus status = program ? PyConfig_SetBytesString(&config, &config.program_name, program) : PyStatus_Ok();
        if (!PyStatus_Exception(status))
            status = Py_InitializeFromConfig(&config);
        PyConfig_Clear(&config);
        if (PyStatus_Exception(status)) {
            fprintf(stderr, "shim: cannot start Python: %s\n", status.err_msg ? status.err_msg : "?");
            return 1;
        }
    }
    PyObject *bridge = PyImport_ImportModule("bridge");
    if (bridge == NULL) {
        PyErr_Print();
        return 1;
    }
    session = PyObject_CallMethod(bridge, "Session", "iiiiiiiii", comm, nlat, nlon, npolar, nazimuth, lat_first,
                                  lat_last, lon_first, lon_last);
    Py_DECREF(bridge);
    if (session == NULL) {
        PyErr_Print();
        return 1;
    }
    return 0;
}

int mps_round_trip(const double *field, double *back, int nlon_loc, int nlat_loc, int nlev)
{
    return report(PyObject_CallMethod(session, "round_trip", "KKiii", (unsigned long long)(uintptr_t)field,
                                      (unsigned long long)(uintptr_t)back, nlon_loc, nlat_loc, nlev));
}

int mps_halo_update(double *padded, int nlon_pad, int nlat_pad, int nlev)
{
    return report(PyObject_CallMethod(session, "halo_update", "Kiii", (unsigned long long)(uintptr_t)padded,
                                      nlon_pad, nlat_pad, nlev));
}

int mps_stop(void)
{
    int status = 0;
    if (session != NULL) {
        status = report(PyObject_CallMethod(session, "close", NULL));
        Py_CLEAR(session);
    }
    /* Python does not finalise MPI it did not initialise: the model calls MPI_Finalize after this. */
    if (Py_IsInitialized() && Py_FinalizeEx() < 0)
        status = 1;
    return status;
}
