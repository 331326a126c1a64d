# cuda.cmake: the CUDA backend (docs/cuda.md), included by CMakeLists.txt before
# the modules are made (the CUDA language must be on when their targets are
# created); ct_cuda_wire() then adds the kernels' library to ct_kernels.
#
#   CT_CUDA  AUTO (default): build it when nvcc is found; ON: required; OFF: not built
#
# nvcc is CMAKE_CUDA_COMPILER when given, else the toolkit scripts/cuda_deps.sh
# installs (NVIDIA's PyPI wheels pinned to CUDA 13.0, ~/.cache/ctuner/cuda-venv or
# $CT_CUDA_VENV), else nvcc on PATH, else /usr/local/cuda. The libraries are found
# beside that nvcc by hand: CMake 3.25's FindCUDAToolkit predates CUDA 13 (it
# fails on the missing nvToolsExt), so it is never used. SASS is embedded for
# sm_90a (H100/H200: wgmma) and sm_80 (A100), plus compute_80 PTX for later
# cards: a 13.0 driver cannot JIT PTX from a newer toolkit, so the SASS matters.
set(CT_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE CT_CUDA PROPERTY STRINGS AUTO ON OFF)
set(CT_CUDA_ENABLED OFF)
if(NOT CT_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    set(venv "$ENV{CT_CUDA_VENV}")
    if(NOT venv)
      set(venv "$ENV{HOME}/.cache/ctuner/cuda-venv")
    endif()
    file(GLOB wheel_nvcc "${venv}/lib/python3*/site-packages/nvidia/cu13/bin/nvcc")
    find_program(CT_NVCC NAMES nvcc HINTS ${wheel_nvcc} PATHS /usr/local/cuda/bin)
    if(wheel_nvcc)
      list(GET wheel_nvcc 0 CT_NVCC)
    endif()
    if(CT_NVCC)
      set(CMAKE_CUDA_COMPILER "${CT_NVCC}" CACHE FILEPATH "nvcc" FORCE)
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES OFF)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
    enable_language(CXX)
    enable_language(CUDA)
    set(CT_CUDA_ENABLED ON)
  elseif(CT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "✗ CT_CUDA=ON but no nvcc: run scripts/cuda_deps.sh (the CUDA 13.0 wheels) "
                        "or pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc")
  endif()
endif()

macro(ct_cuda_wire)
if(CT_CUDA_ENABLED)
  get_filename_component(cu_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  get_filename_component(CT_CUDA_ROOT "${cu_bin}" DIRECTORY)
  foreach(lib cudart cublasLt cublas)
    find_library(CT_CUDA_LIB_${lib} NAMES ${lib} PATHS "${CT_CUDA_ROOT}/lib" "${CT_CUDA_ROOT}/lib64"
                 "${CT_CUDA_ROOT}/targets/x86_64-linux/lib" NO_DEFAULT_PATH)
    if(NOT CT_CUDA_LIB_${lib})
      message(FATAL_ERROR "✗ lib${lib}.so not found under ${CT_CUDA_ROOT}: run scripts/cuda_deps.sh "
                          "(it also makes the unversioned links the wheels lack)")
    endif()
  endforeach()
  get_filename_component(CT_CUDA_LIBDIR "${CT_CUDA_LIB_cudart}" DIRECTORY)
  message(STATUS "✓ CUDA ${CMAKE_CUDA_COMPILER_VERSION}: ${CMAKE_CUDA_COMPILER} (libraries in ${CT_CUDA_LIBDIR})")

  file(GLOB ct_cu_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/kernels/cuda/*.cu)
  add_library(ct_kernels_cuda STATIC ${ct_cu_srcs})
  target_include_directories(ct_kernels_cuda PRIVATE include src ${CT_CUDA_ROOT}/include)
  set(ct_cu_flags -O3 --expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills
      -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80
      -gencode=arch=compute_80,code=compute_80 -Xcompiler=-Wall)
  if(CT_WERROR)
    list(APPEND ct_cu_flags -Werror=all-warnings -Xcompiler=-Werror)
  endif()
  target_compile_options(ct_kernels_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${ct_cu_flags}>)
  set_target_properties(ct_kernels_cuda PROPERTIES CUDA_RUNTIME_LIBRARY Shared POSITION_INDEPENDENT_CODE ON)
  target_compile_definitions(ct_kernels PUBLIC CT_CUDA=1)
  target_link_libraries(ct_kernels PUBLIC ct_kernels_cuda ${CT_CUDA_LIB_cublasLt} ${CT_CUDA_LIB_cublas}
                                          ${CT_CUDA_LIB_cudart} stdc++)
  # CMake leaves nvcc's own library directory out of the RPATH (an implicit one): named here, so
  # that every binary finds the wheels' libcudart.so.13 without LD_LIBRARY_PATH
  target_link_options(ct_kernels PUBLIC "-Wl,-rpath,${CT_CUDA_LIBDIR}")
else()
  message(STATUS "- CUDA backend not built (CT_CUDA=${CT_CUDA}; scripts/cuda_deps.sh installs nvcc)")
endif()
endmacro()
